# The Conveyor image: Conveyor, its migrations and Flower, and nothing of yours. Extend it with
# your node modules (see examples/own-project/ and docs/quickstart.md):
#   docker build -t conveyor .                       # this image, from the repository's root
#   FROM conveyor                                    # first line of your project's Dockerfile
#   COPY --chown=root:root myapp /app/myapp          # your modules, importable from /app
#   ENV CONVEYOR_IMPORTS=myapp.nodes
# Only what .dockerignore lets through reaches the build (not .venv, .git, .conveyor, tests).
FROM python:3.11-slim

ENV PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# Conveyor lives in /opt/conveyor, installed editable: `conveyor db upgrade` finds alembic.ini
# and migrations/ beside the package.
WORKDIR /opt/conveyor
COPY pyproject.toml README.md alembic.ini ./
COPY conveyor ./conveyor
COPY migrations ./migrations
RUN pip install -e ".[flower,otlp]"

# Your code goes in /app: the working directory of every command, and on the import path, so
# that CONVEYOR_IMPORTS=myapp.nodes finds /app/myapp/nodes.py in workers, beat and the API.
WORKDIR /app
ENV PYTHONPATH=/app

# Processes run unprivileged, as nobody given by number so that Kubernetes' runAsNonRoot can
# check it; beat writes its heartbeat under /tmp (see the compose file).
USER 65534:65534
EXPOSE 8000 5555
CMD ["conveyor", "--help"]
