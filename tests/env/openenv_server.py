"""`python -m tests.env.openenv_server PORT`: tests/env/openenv_game.py's Game served by openenv-core on 127.0.0.1
(uvicorn, WebSocket /ws, at most 32 sessions at once), until killed."""

import sys

import uvicorn
from openenv.core.env_server.http_server import create_fastapi_app

from tests.env.openenv_game import Game, GuessAction, GuessObservation

if __name__ == "__main__":
    app = create_fastapi_app(Game, GuessAction, GuessObservation, max_concurrent_envs=32)
    uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning")
