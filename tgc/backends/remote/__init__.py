"""The REMOTE device: any local device served over HTTP (`tgc serve`) and used from another process.

- `protocol`: the wire format of one `POST /batch` (content-addressed blobs, then the request list as
  text parsed by a whitelist, never pickle or eval);
- `server`: `serve`/`main_serve`, what `tgc serve` runs;
- `client`: `RemoteDevice`, the `REMOTE` device that queues work and sends it in batches;
- `process`: `ServerProcess`, a server in a child process on a free loopback port (tests, benchmarks).
"""
