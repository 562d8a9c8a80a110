"""The long-document preset (conf/workload/longdoc.yaml): 32K-120K prompts over a few
shared documents, within a 128K context."""

from harness.workloads import build_workload
from harness.workloads.presets import load_preset


def test_longdoc_prompts_are_long_and_share_their_documents():
    node = load_preset("longdoc")
    workload = build_workload(node, seed=0, max_model_len=131072)
    requests = workload.requests
    assert len(requests) == 60
    lens = [r.prompt_len for r in requests]
    assert min(lens) >= 512 + 32000 + 8 and max(lens) <= 512 + 120000 + 128
    assert all(r.prompt_len + r.output_len <= 131072 for r in requests)
    system = {bytes(r.prompt_token_ids[:512]) for r in requests}
    documents = {bytes(r.prompt_token_ids[512:512 + 32000]) for r in requests}
    assert len(system) == 1 and len(documents) <= 8  # every question reuses one of 8 documents
