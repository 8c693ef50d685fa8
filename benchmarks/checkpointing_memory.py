"""Peak memory of one training step at the `base` shape, with and without gradient checkpointing.

One fresh process per measurement (peak RSS is per process): builds a `base`-preset TupeForMaskedLM (12 x 768,
12 heads, FFN 3072, vocabulary of the preset), runs forward + backward on one batch of random tokens with 15%
of them as masked-LM targets, and prints the process's peak resident memory (model, gradients and the
activations kept for backward) and the step's time. Usage (docs/benchmarks.md):

    python benchmarks/checkpointing_memory.py SCHEME BATCH SEQ_LEN on|off
"""

import resource
import time

import torch

from tupe import POSITION_SCHEMES, TupeConfig, TupeForMaskedLM
from tupe.bench.flops import preset_shape
from tupe.scripts import ScriptParser, parse_or_exit
from tupe.validators import int_range

parser = ScriptParser(prog="checkpointing_memory.py", description=__doc__.splitlines()[0])
parser.add_argument("scheme", choices=POSITION_SCHEMES)
parser.add_argument("batch", type=int_range(1, 4096))
parser.add_argument("seq_len", type=int_range(1, 65536))
parser.add_argument("checkpointing", choices=("on", "off"))
args = parse_or_exit(parser)


def peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


scheme, batch, seq_len, checkpointing = args.scheme, args.batch, args.seq_len, args.checkpointing == "on"
torch.manual_seed(0)
torch.set_num_threads(2)
shape = preset_shape("base")
config = TupeConfig(
    position_scheme=scheme,
    vocab_size=shape.vocab_size,
    hidden_size=shape.hidden_size,
    num_hidden_layers=shape.num_hidden_layers,
    num_attention_heads=shape.num_attention_heads,
    intermediate_size=shape.intermediate_size,
    max_position_embeddings=max(512, seq_len),
    sparse_prediction=True,  # as tupe pretrain trains
)
model = TupeForMaskedLM(config).train()
if checkpointing:
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
ids = torch.randint(5, config.vocab_size, (batch, seq_len))
labels = torch.where(torch.rand(batch, seq_len) < 0.15, ids, -100)
start = time.perf_counter()
model(input_ids=ids, labels=labels).loss.backward()
seconds = time.perf_counter() - start
print(
    f"{scheme} batch {batch} x {seq_len} checkpointing {'on' if checkpointing else 'off'}: "
    f"peak RSS {peak_mib():.0f} MiB, step {seconds:.2f} s"
)
