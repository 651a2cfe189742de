# One image for the API, the workers and beat; the command picks the role.
FROM python:3.11-slim
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1
WORKDIR /app
COPY pyproject.toml README.md ./
COPY omnijobs ./omnijobs
COPY api ./api
COPY tasks ./tasks
COPY storage ./storage
COPY migrations ./migrations
COPY core ./core
COPY media ./media
COPY pipelines ./pipelines
RUN pip install ".[flower]"
# An unprivileged user, uid 1000 as the Kubernetes manifests' runAsUser: no process of
# the service needs root (and Celery warns at every worker start under it).
RUN useradd --uid 1000 --create-home omnijobs
USER omnijobs
# Production by default: the image refuses to start with placeholder secrets or without
# its database and broker URLs rather than serve the embedded mode on 0.0.0.0.
ENV OMNIJOBS_HOME=/home/omnijobs/.omnijobs OMNIJOBS_MODE=production
EXPOSE 8000
CMD ["omnijobs", "api", "--host", "0.0.0.0", "--port", "8000"]
