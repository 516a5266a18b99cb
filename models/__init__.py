"""models: what produces a forecast, below forecaster.py. A first read may skip this folder.

forecaster.py (top level) turns a prompt into 8 bin probabilities; the models behind it live here:

  forecaster_backends.py  the one small interface (logits or text for a batch of prompts) and its
                          backends: a local transformers model, an OpenAI-compatible server (vLLM,
                          SGLang), and the embedded SmolLM2 for machines without weights.
  lm.py                   the language model's mechanics: finding and loading weights (GPT-OSS's
                          MXFP4 included), chat formats, batched logits and generation.
  lm_memory.py            how many rows of a batch fit in a GPU's free memory.
  prefix_attention.py     attention that computes a shared prompt prefix once per group.
  harmony.py              GPT-OSS's harmony chat format, written and read in one place.
  costmodel.py            a learned cost model (gradient-boosted trees) as a forecaster backend,
  costmodel_features.py   and the features it reads from an (anchor, candidate) pair's code.
"""
