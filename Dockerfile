# Patroller as a container. On the GPU host it needs the host's view of processes, sockets and
# GPUs, as docs/gpu-host.md ("In a container") explains:
#   mkdir -p /run/patroller
#   docker run -d --name patroller --restart unless-stopped \
#     --gpus all --pid host --network host --cap-add SYS_PTRACE \
#     -v /var/run/docker.sock:/var/run/docker.sock \
#     -v /run/podman:/run/podman \
#     -v /run/patroller:/run/patroller \
#     -v /var/lib/patroller:/var/lib/patroller \
#     patroller --socket /run/patroller/api.sock
# Never `-p 8080:8080` there: through Docker's port mapping every caller is the bridge gateway, and
# nobody can be identified. Try it without a GPU:  docker run --rm -p 8080:8080 patroller --test
FROM python:3.11-slim

WORKDIR /opt/patroller
COPY requirements.txt ./
RUN pip install --no-cache-dir -r requirements.txt
COPY setup.py pyproject.toml README.md LICENSE ./
COPY patroller ./patroller
# with the kubernetes extra (grpcio): containerd's API and the kubelet's pod-resources; and
# the notify extra (Apprise): notifications by e-mail, Slack, ntfy, webhooks (--notify)
RUN pip install --no-cache-dir '.[kubernetes,notify]' && rm -rf /root/.cache

# The C allocator for Python's objects: a usage report's memory comes back once it ends
# (docs/performance.md; the systemd unit sets the same)
ENV PYTHONMALLOC=malloc
EXPOSE 8080
STOPSIGNAL SIGTERM
ENTRYPOINT ["patroller"]
