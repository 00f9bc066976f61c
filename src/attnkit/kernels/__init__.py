"""The engine room: speed machinery that a reader of the paper does not need.

- `loader`: C sources built on the machine that runs them, loaded through ctypes
- `cpu`: the CPU's model name and the instruction sets that pick a path
- `few_rows`: float32 products of a few rows (decoding), `few_rows.c`
- `int8_rows`: int8 products of many rows, `int8_rows.c`
- `step_attention`: one decoding step's attention in one call, `step_attention.c`
- `onednn`: oneDNN's float32 products on AVX-512, where a probe shows they pay
- `sgns`: word2vec's SGD loop, `sgns.c`
- `glove`: GloVe's co-occurrence counting and AdaGrad loop, `glove.c`

The layers in `attnkit.nn` call these; nothing here imports a layer.
"""
