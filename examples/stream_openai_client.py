"""Start `specpilot serve` (the embedded SmolLM2) and stream a chat completion with the `openai` client.

Needs the server extra: pip install -e ".[server]".

    python examples/stream_openai_client.py --max-tokens 32
"""

import argparse
import os
import subprocess
import sys
import time

import httpx
from openai import OpenAI


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--port", type=int, default=8765)
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--prompt", default="Name three colors.")
    args = p.parse_args()

    cmd = [sys.executable, "-m", "sglang_specpilot.cli", "serve", "--port", str(args.port), "--max-seq-len", "1024",
           "--log-level", "warning"]  # fmt: skip
    server = subprocess.Popen(cmd, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    base = f"http://127.0.0.1:{args.port}"
    try:
        deadline = time.monotonic() + 180
        while True:  # wait until the model is loaded and the server answers
            try:
                if httpx.get(base + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if server.poll() is not None or time.monotonic() > deadline:
                raise SystemExit("the server did not start")
            time.sleep(0.5)
        client = OpenAI(base_url=base + "/v1", api_key="unused")
        model = client.models.list().data[0].id
        stream = client.chat.completions.create(
            model=model,
            messages=[{"role": "user", "content": args.prompt}],
            max_tokens=args.max_tokens,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
        usage = None
        for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                print(chunk.choices[0].delta.content, end="", flush=True)
            usage = chunk.usage or usage
        print(f"\n--- {usage.completion_tokens} tokens streamed from {model}")
    finally:
        server.terminate()
        server.wait(30)


if __name__ == "__main__":
    main()
