"""Comparisons with peer stacks, run by `python -m benchmarks.peers` (`__main__`; docs/benchmarks.md): our train
step against transformers `ZayaForCausalLM` on PyTorch (`train`, `torch_ref`) and MaxText's MoE trainer
(`maxtext`). They live in the repository next to their recorded results, not in the installed package."""
