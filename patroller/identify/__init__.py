"""Who is behind a process or a request: /proc, cgroups, container labels, socket owners.

Owns: the /proc readers, the cgroup parser, the container directory (labels through the Docker
API), containerd's directory (its gRPC API), the cached and shared lookups both make
(`lookups`), the identity of a Kubernetes
pod's container, which engine names which container (Docker, Podman, users' rootless engines,
containerd), the owner of a local TCP socket, unix peer credentials, what is known of one
connection (`connection`: its facts, on it, and the one reader of Tornado's undocumented
HTTP1Connection.stream), the pid-to-identity resolver, the caller of a request, and the tracker
that tells the lease manager whose processes appear.
May import: `patroller.observe`, `patroller.config`, `patroller.core`, `patroller.durations`;
Tornado (the request type, the IOStream a connection's facts ride on), the Docker SDK and
cachetools.
"""
