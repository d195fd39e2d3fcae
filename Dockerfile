# Patroller as a container. On the GPU host it needs the host's view of processes and GPUs:
#   docker run -d --name patroller --restart unless-stopped --gpus all --pid host \
#     -v /var/run/docker.sock:/var/run/docker.sock -p 80:80 patroller
# Try it without a GPU:  docker run --rm -p 8080:80 patroller --test
FROM python:3.11-slim

WORKDIR /opt/patroller
COPY requirements.txt ./
RUN pip install --no-cache-dir -r requirements.txt
COPY setup.py pyproject.toml README.md LICENSE ./
COPY patroller ./patroller
RUN pip install --no-cache-dir --no-deps . && rm -rf /root/.cache

EXPOSE 80
STOPSIGNAL SIGTERM
ENTRYPOINT ["patroller"]
