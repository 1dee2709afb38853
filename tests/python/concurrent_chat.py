"""Concurrent non-streaming chats through the official `openai` SDK, against corral.

Usage: concurrent_chat.py BASE_URL MODEL N MAX_TOKENS

Run by tests/llama_server.rs with CORRAL_PYTHON. Sends N chat completions at once (one thread each,
released together by a barrier, one shared client) and prints one JSON line on stdout:

    {"ok": K, "errors": ["..."], "results": [{"start_s": ..., "end_s": ..., "finish_reason": ...,
     "completion_tokens": ..., "content": ...}], "total_s": T}

`ok` counts the completions that came back with a non-empty choice; `errors` holds one line for each
that did not. `start_s` and `end_s` are seconds since the barrier released the threads. The exit
status is 0 whenever the JSON was printed; the caller judges it.
"""

import json
import sys
import threading
import time

from openai import OpenAI


def main() -> None:
    if len(sys.argv) != 5:
        sys.exit(__doc__)
    base_url, model = sys.argv[1], sys.argv[2]
    n, max_tokens = int(sys.argv[3]), int(sys.argv[4])
    client = OpenAI(base_url=f"{base_url}/v1", api_key="x", timeout=60.0, max_retries=0)
    barrier = threading.Barrier(n + 1)
    lock = threading.Lock()
    results, errors = [], []
    started = 0.0

    def one(i: int) -> None:
        barrier.wait()
        start = time.perf_counter() - started
        try:
            completion = client.chat.completions.create(
                model=model,
                messages=[{"role": "user", "content": f"Tell me story number {i} about a fox."}],
                max_tokens=max_tokens,
            )
            end = time.perf_counter() - started
            if not completion.choices or not completion.choices[0].message.content:
                raise AssertionError(f"empty reply: {completion!r}")
            choice = completion.choices[0]
            usage = completion.usage
            with lock:
                results.append(
                    {
                        "start_s": start,
                        "end_s": end,
                        "finish_reason": choice.finish_reason,
                        "completion_tokens": usage.completion_tokens if usage else None,
                        "content": choice.message.content,
                    }
                )
        except Exception as e:  # noqa: BLE001 - every failure is reported, none is fatal
            with lock:
                errors.append(f"request {i}: {type(e).__name__}: {e}")

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    started = time.perf_counter()
    barrier.wait()
    for t in threads:
        t.join()
    total = time.perf_counter() - started

    print(
        json.dumps({"ok": len(results), "errors": errors, "results": results, "total_s": total}),
        flush=True,
    )


if __name__ == "__main__":
    main()
