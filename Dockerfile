# berth: a static binary on a distroless base, running as non-root.
# Build: docker build -t berth:0.1.0 .   (the build step is scripts/build-static)
FROM rust:1.95-bookworm AS build
WORKDIR /src
COPY . .
RUN scripts/build-static && cp target/static/x86_64-unknown-linux-gnu/release/berth /berth

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /berth /berth
USER 65532:65532
EXPOSE 8443 9090
ENTRYPOINT ["/berth"]
CMD ["serve"]
