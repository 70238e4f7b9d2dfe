"""The recipe guide's OpenAI client, pointed at a k3deploy endpoint.

    python tools/chat.py http://10.77.0.11:8000 [MODEL]

Same client settings as the Kimi-K3 recipe guide (api_key "EMPTY", /v1 base URL, one-hour timeout); the
message is text only, since the guide's sample image URL lies outside the cluster network.
"""

from __future__ import annotations

import sys
import time
from typing import Any

from openai import OpenAI


def main(argv: list[str]) -> int:
    if not argv:
        print("usage: python tools/chat.py ENDPOINT [MODEL]", file=sys.stderr)
        return 2
    endpoint, model = argv[0].rstrip("/"), (argv[1] if len(argv) > 1 else "moonshotai/Kimi-K3")
    client = OpenAI(api_key="EMPTY", base_url=f"{endpoint}/v1", timeout=3600)
    messages: list[Any] = [{"role": "user", "content": [{"type": "text", "text": "Read all the text in the image."}]}]
    start = time.time()
    response = client.chat.completions.create(model=model, messages=messages, max_tokens=2048)
    print(f"Response costs: {time.time() - start:.2f}s")
    print(f"Generated text: {response.choices[0].message.content}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
