# The tuner itself, for the Kubernetes CronJob (`tuner schedule --target kubernetes`) and the
# distributed tuning Job (`tuner cluster job`). Both run `tuner ...` through /bin/sh with a
# volume mounted at /var/lib/tuner. Build from the repository root:
#
#   docker build -t tuner:latest .
#
# CPU only: the tuner replays traces on a CPU twin of vLLM's scheduler; it needs no GPU and
# no vLLM. The PostgreSQL driver is included for shared studies (--storage postgresql://).
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /opt/tuner
COPY pyproject.toml README.md ./
COPY tuner ./tuner
RUN pip install '.[postgres]' && tuner --version

# The manifests run as uid/gid 1000 with fsGroup 1000 so the volume is writable.
RUN groupadd --gid 1000 tuner && useradd --uid 1000 --gid 1000 --create-home tuner
USER 1000:1000
WORKDIR /var/lib/tuner

CMD ["tuner", "--help"]
