# corral in a small image, as a non-root user, serving /etc/corral (a mounted ConfigMap) and
# following its updates. Two targets:
#   docker build -t corral .                        corral alone (engines come from the config)
#   docker build --target llama -t corral-llama .   corral with a CPU llama-server beside it
# The binary is built from this checkout with the same locked dependencies CI builds with, guided
# by the profile of a recorded workload (scripts/build-pgo.sh).

FROM rust:1-bookworm AS build
WORKDIR /src
# llvm-profdata for the profile, python3 for the workload's bookkeeping
RUN rustup component add llvm-tools \
    && apt-get update \
    && apt-get install -y --no-install-recommends python3 \
    && rm -rf /var/lib/apt/lists/*
COPY . .
RUN scripts/build-pgo.sh \
    && install -D target/pgo/corral /out/corral

# llama-server, built by the same script the test suite uses (CPU only; a CUDA build belongs in an
# image made from nvidia/cuda with -DGGML_CUDA=ON).
FROM rust:1-bookworm AS llama-build
WORKDIR /src
COPY scripts/install-llama-server.sh scripts/
RUN CORRAL_CACHE=/cache scripts/install-llama-server.sh \
    && install -D /cache/llama-server-*/bin/llama-server /out/llama-server

FROM debian:bookworm-slim AS corral
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --system --uid 10001 --home-dir /var/lib/corral --create-home corral
COPY --from=build /out/corral /usr/local/bin/corral
USER 10001:10001
ENV CORRAL_STATE_DIR=/var/lib/corral \
    HF_HOME=/models/huggingface \
    OLLAMA_MODELS=/models/ollama \
    CORRAL_CACHE=/models/corral
EXPOSE 8080
# corral reaps orphans when it runs as PID 1, so no init is needed.
ENTRYPOINT ["/usr/local/bin/corral"]
CMD ["--config-dir", "/etc/corral", "--watch-config", "--listen", ":8080"]

FROM corral AS llama
USER 0
RUN apt-get update \
    && apt-get install -y --no-install-recommends libgomp1 \
    && rm -rf /var/lib/apt/lists/*
COPY --from=llama-build /out/llama-server /usr/local/bin/llama-server
USER 10001:10001

# The default target: corral alone.
FROM corral
