"""Run reasoning-gym's GSM-symbolic templates in a separate interpreter and print the items as JSON lines.

Started by ``corpus.py`` as ``python -I gsm_runner.py SRC_DIR PER_TEMPLATE SEED``. SRC_DIR holds the two
template modules and ``reasoning_gym/utils.py`` copied from the wheel (stdlib-only code), so the full package
and its eleven dependencies are never installed or imported; a child process keeps that stand-in package out
of the caller's ``sys.modules``. Kept free of project imports on purpose.
"""

from __future__ import annotations

import importlib
import json
import random
import sys


def main(argv: list[str]) -> int:
    src, per_template, seed = argv[1], int(argv[2]), int(argv[3])
    sys.path.insert(0, src)
    out = sys.stdout
    for module_name in ("gsm_generators_00_49", "gsm_generators_50_99"):
        module = importlib.import_module(module_name)
        for name in sorted(n for n in dir(module) if n.startswith("generate_")):
            template = int(name.removeprefix("generate_"))
            rng = random.Random(seed * 1000 + template)
            for k in range(per_template):
                try:
                    item = getattr(module, name)(rng, 1.0)
                except Exception:  # a few upstream templates fail on some draws: skip those draws
                    continue
                meta = item.get("metadata", {})
                row = {
                    "template": template,
                    "k": k,
                    "question": item["question"],
                    "answer": str(item["answer"]),
                    "steps": len(str(meta.get("answer_cot", "")).strip().splitlines()),
                }
                out.write(json.dumps(row) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
