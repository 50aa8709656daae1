"""A studio server for the projects' kill test that restarts in a fraction of a second.

`python -m tests.projects_server` loads the demo engine once (torch on one thread, so forking is safe) and
the studio's modules, then, for each `start FOLDER` line on stdin, forks a child that serves the studio's
service, the projects' store in FOLDER, its render worker and the HTTP API on a free port (its output in
FOLDER/server.log), and answers `<pid> <port>`. The test
`kill -9`s the child; the next child opens the database afresh and resumes the job from what is on disk,
exactly as `app.py` does at start (app.start_projects), without 10 s of imports and model loading each
time. Its first line is the engine's `EngineInfo` as JSON, so the test can read the projects' audio too.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import sys

import torch


def main() -> None:
    torch.set_num_threads(1)  # no thread pool exists to be lost across fork()
    import uvicorn  # noqa: F401  (imported once here, not in every child)

    from engine.demo import demo_checkpoint
    from engine.generate import Engine
    from studio import api  # noqa: F401
    from studio.projects import jobs, library  # noqa: F401
    from tests.studio_server import free_port

    engine = Engine.load(demo_checkpoint(), device="cpu", precision="fp32", max_batch=2)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # killed children are reaped without a wait
    print(json.dumps({k: v for k, v in dataclasses.asdict(engine.info).items()}), flush=True)
    for line in sys.stdin:
        command, _, folder = line.strip().partition(" ")
        if command != "start" or not folder:
            continue
        port = free_port()
        pid = os.fork()
        if pid == 0:
            os.makedirs(folder, exist_ok=True)
            log = os.open(os.path.join(folder, "server.log"), os.O_WRONLY | os.O_CREAT | os.O_APPEND)
            os.dup2(log, 1)
            os.dup2(log, 2)
            _serve(engine, folder, port)
            os._exit(0)
        print(f"{pid} {port}", flush=True)


def _serve(engine, folder: str, port: int) -> None:
    import uvicorn
    from fastapi import FastAPI

    from studio import api
    from studio.projects.jobs import JobRunner
    from studio.projects.library import Projects
    from studio.projects.store import Store
    from studio.takes.service import StudioService

    service = StudioService(engine, None, None)
    projects = Projects(Store(folder), service)
    runner = JobRunner(projects, service)
    runner.start()
    app = FastAPI()
    api.register(app, service, projects=projects, runner=runner)
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")


if __name__ == "__main__":
    main()
