"""The recipe guide's OpenAI client, pointed at a k3deploy endpoint: asks one question, prints the answer.

    python tools/chat.py http://10.77.0.11:8000 "What is the capital of France?"
    python tools/chat.py http://10.77.0.11:8000 --model moonshotai/Kimi-K3 --max-tokens 256 "Hello"

Same client settings as the Kimi-K3 recipe guide (api_key "EMPTY", /v1 base URL, one-hour timeout); the
message is text only, since the guide's sample image URL lies outside the cluster network.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

DEFAULT_QUESTION = "Hello! Who are you, in one sentence?"


def parse(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python tools/chat.py", description="Ask a k3deploy endpoint one question "
                                 "with the recipe guide's OpenAI client.")
    ap.add_argument("endpoint", help="the endpoint k3deploy prints, e.g. http://10.77.0.11:8000")
    ap.add_argument("question", nargs="*", help=f"the question (words are joined; default: {DEFAULT_QUESTION!r})")
    ap.add_argument("--model", default="moonshotai/Kimi-K3", help="served model name (default: %(default)s)")
    ap.add_argument("--max-tokens", type=int, default=2048, help="answer length limit (default: %(default)s)")
    return ap.parse_args(argv)


def main(argv: list[str]) -> int:
    args = parse(argv)
    from openai import OpenAI

    question = " ".join(args.question) or DEFAULT_QUESTION
    client = OpenAI(api_key="EMPTY", base_url=f"{args.endpoint.rstrip('/')}/v1", timeout=3600)
    messages: list[Any] = [{"role": "user", "content": [{"type": "text", "text": question}]}]
    start = time.time()
    response = client.chat.completions.create(model=args.model, messages=messages, max_tokens=args.max_tokens)
    print(f"Question: {question}")
    print(f"Response costs: {time.time() - start:.2f}s")
    print(f"Generated text: {response.choices[0].message.content}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
