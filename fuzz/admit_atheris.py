"""Coverage-guided fuzzing of the admission decision with atheris (libFuzzer).

    python3 fuzz/admit_atheris.py -runs=100000 tests/golden/*/

Each input is a request body; the golden reviews are the seed corpus. The
harness fails (and libFuzzer saves the input) when ``admit`` raises, answers
with a status other than 200 or 400, answers a valid envelope with anything
but an AdmissionReview echoing the uid, or returns a patch that does not
apply to the object it was given.
"""

from __future__ import annotations

import base64
import json
import sys

import atheris

with atheris.instrument_imports(include=["webhook"]):
    from webhook.decision.admission import admit
    from webhook.decision.policy import DEFAULT_POLICY

import jsonpatch  # after instrumentation: only the webhook's own code is traced


def check(data: bytes) -> None:
    result = admit(data, DEFAULT_POLICY)
    if result.status == 400:
        return
    assert result.status == 200, result.status
    review = json.loads(data)
    answer = json.loads(result.encode())  # what the server sends
    response = answer["response"]
    assert response["uid"] == review["request"]["uid"]
    assert answer["kind"] == "AdmissionReview"
    if "patch" in response:
        patch = json.loads(base64.b64decode(response["patch"]))
        jsonpatch.apply_patch(review["request"]["object"], patch)


def main() -> None:
    atheris.Setup(sys.argv, check)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
