# One image for the operator (kopf run -m zeps_operator.handlers) and the broker (zeps-broker).
# It cannot be built on the project's CI machines (no container engine there); the kind e2e suite
# builds and loads it where one exists (e2e/run-kind.sh).
FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml constraints.txt README.md ./
COPY sdk sdk
COPY operator operator
RUN pip wheel --no-cache-dir -c constraints.txt --wheel-dir /wheels ".[operator]"

FROM python:3.11-slim
RUN useradd --uid 10001 --create-home zeps
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir /wheels/*.whl && rm -rf /wheels
USER 10001
ENTRYPOINT []
CMD ["zeps-broker", "--help"]
