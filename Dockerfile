# The Governor image: the `governor` CLI and every component it starts (router, workers, ...).
#   docker build -t governor .
#   docker run --rm governor --help
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# Only what the package build needs (every dependency ships manylinux wheels: no compiler).
WORKDIR /tmp/governor-src
COPY pyproject.toml ./
COPY schemas ./schemas
COPY streams ./streams
COPY controllers ./controllers
COPY workers ./workers
COPY analytics ./analytics
COPY infra ./infra
RUN pip install . \
    && rm -rf /tmp/governor-src \
    && useradd --create-home --uid 10001 --user-group governor

USER governor
WORKDIR /home/governor

ENTRYPOINT ["governor"]
CMD ["--help"]
