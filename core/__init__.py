"""Leaf package: settings, the error tree, job kinds and statuses. Imports nothing of ours."""
