"""What a fresh interpreter sees of the registration (run by the child-process contract test).

``probe()`` returns plain data so it can cross a multiprocessing queue; ``main`` prints it as JSON, after
checking the start-up hook arrived through the ``.pth`` (before anything imported sglang or torch).
"""

from __future__ import annotations

import json
import multiprocessing as mp
import sys


def probe() -> dict:
    from tests.sglang_support.standins import install

    install()
    import argparse

    from sglang.srt.layers.quantization import QUANTIZATION_METHODS
    from sglang.srt.server_args import ServerArgs
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    ns = parser.parse_args(["--model-path", "m", "--speculative-algorithm", "specpilot", "--quantization", "w12"])
    return {
        "algorithm": ns.speculative_algorithm,
        "quantization": ns.quantization,
        "maps_to": SpeculativeAlgorithm.from_string("specpilot").name,
        "w12_config": QUANTIZATION_METHODS["w12"].__name__,
    }


def _spawned(queue) -> None:
    try:
        queue.put(probe())
    except Exception as e:  # the parent shows it
        queue.put({"error": repr(e)})


def main() -> None:
    startup = {"hook": "specpilot_sglang_hook" in sys.modules, "sglang_before": "sglang" in sys.modules}
    here = probe()
    # SGLang starts its scheduler with the spawn method: a fresh interpreter that must find the hook itself.
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    p = ctx.Process(target=_spawned, args=(queue,))
    p.start()
    spawned = queue.get(timeout=300)
    p.join(timeout=60)
    print(json.dumps({"startup": startup, "here": here, "spawned": spawned}))


if __name__ == "__main__":
    main()
