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
RUN pip install .
RUN useradd --create-home omnijobs
USER omnijobs
ENV OMNIJOBS_HOME=/home/omnijobs/.omnijobs
EXPOSE 8000
CMD ["omnijobs", "api", "--host", "0.0.0.0", "--port", "8000"]
