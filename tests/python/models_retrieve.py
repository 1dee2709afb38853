"""One model through the official `openai` SDK's `client.models.retrieve`, against corral.

Usage: models_retrieve.py BASE_URL MODEL MISSING_MODEL

Run by tests/router_api.rs with CORRAL_PYTHON. Retrieves MODEL, then MISSING_MODEL, which must
raise the SDK's error for a 404, and prints one JSON line on stdout:

    {"id": ..., "object": ..., "context_length": ..., "missing": "<exception class name>"}

Exits non-zero on any other failure.
"""

import json
import sys

import openai
from openai import OpenAI


def main() -> None:
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    base_url, model, missing = sys.argv[1:]
    client = OpenAI(base_url=f"{base_url}/v1", api_key="x", timeout=30.0, max_retries=0)
    found = client.models.retrieve(model)
    try:
        client.models.retrieve(missing)
        raised = None
    except openai.NotFoundError as e:
        raised = type(e).__name__
    extra = found.model_extra or {}
    print(
        json.dumps(
            {
                "id": found.id,
                "object": found.object,
                "context_length": extra.get("context_length"),
                "missing": raised,
            }
        )
    )


if __name__ == "__main__":
    main()
