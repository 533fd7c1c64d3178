"""transformers models built from small configs (random weights) through both frontends:
torch.export and torch's ONNX exporter (TorchScript, dynamo=False), one dynamic dim each (the
sequence, the batch or the audio length), compiled once and compared with eager torch at three
sizes to 1e-4 relative (the largest error over the output, divided by the output's largest
magnitude). An acceptance run (minutes on 2 cores), recorded in docs/conformance.md:

    TILEWORK_LONG_TESTS=1 python -m pytest tests/frontend/test_hf_models.py -n 0
"""

from __future__ import annotations

import io
import warnings
from typing import Any, Callable

import numpy as np
import pytest
from tests.long import LONG, long_only

pytestmark = [pytest.mark.slow, long_only("the acceptance run")]
torch = pytest.importorskip("torch", reason="needs torch (an optional extra)")
tf = pytest.importorskip("transformers", reason="needs transformers")

import tilework  # noqa: E402
from tilework.frontend.onnx import from_onnx  # noqa: E402
from tilework.frontend.torch import translate  # noqa: E402

Model = tuple[Callable[[], Any], str, Callable[[int], Any], int]  # make, output field, input at size n, dynamic axis


def _models() -> dict[str, Model]:
    ids = lambda n: torch.randint(0, 100, (2, n))  # noqa: E731
    image = lambda n: torch.randn(n, 3, 32, 32)  # noqa: E731
    return {
        "bert_encoder": (lambda: tf.BertModel(tf.BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64)), "last_hidden_state", ids, 1),
        "gpt2_decoder": (lambda: tf.GPT2Model(tf.GPT2Config(vocab_size=100, n_embd=32, n_layer=2, n_head=4, n_positions=64)), "last_hidden_state", ids, 1),
        "t5_encoder": (lambda: tf.T5EncoderModel(tf.T5Config(vocab_size=100, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4)), "last_hidden_state", ids, 1),
        "vit_vision": (lambda: tf.ViTModel(tf.ViTConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, image_size=32, patch_size=8)), "last_hidden_state", image, 0),
        "resnet_classification": (lambda: tf.ResNetModel(tf.ResNetConfig(embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1], layer_type="basic")), "last_hidden_state", image, 0),
        "segformer_segmentation": (lambda: tf.SegformerForSemanticSegmentation(tf.SegformerConfig(num_encoder_blocks=2, depths=[1, 1], sr_ratios=[2, 1], hidden_sizes=[8, 16], num_attention_heads=[1, 2], decoder_hidden_size=16, num_labels=3, patch_sizes=[7, 3], strides=[4, 2], mlp_ratios=[2, 2])), "logits", image, 0),
        "wav2vec2_speech": (lambda: tf.Wav2Vec2Model(tf.Wav2Vec2Config(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, conv_dim=(16, 16), conv_stride=(5, 2), conv_kernel=(10, 3), num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=4)), "last_hidden_state", lambda n: torch.randn(2, 400 + 10 * n), 1),
    }  # fmt: skip


MODELS = _models() if LONG else {}


class _Field(torch.nn.Module):
    def __init__(self, model: Any, field: str) -> None:
        super().__init__()
        self.model, self.field = model, field

    def forward(self, x: Any) -> Any:
        return getattr(self.model(x), self.field)


@pytest.mark.parametrize("frontend", ["torch.export", "onnx"])
@pytest.mark.parametrize("name", sorted(MODELS) or ["none"])
def test_matches_framework(name: str, frontend: str) -> None:
    torch.manual_seed(0)
    make, field, inputs, axis = MODELS[name]
    model = _Field(make().eval(), field).eval()
    example = inputs(9)
    if frontend == "torch.export":
        dim = torch.export.Dim.AUTO if "speech" in name else torch.export.Dim("d", min=2, max=256)
        tr = translate(torch.export.export(model, (example,), dynamic_shapes=({axis: dim},), strict=False))
        fn, weights = tilework.VM(tilework.build(tr.module))["main"], [a for _, a in tr.weights]
    else:
        f = io.BytesIO()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.onnx.export(model, (example,), f, input_names=["x"], dynamic_axes={"x": {axis: "d"}}, opset_version=17, dynamo=False)
        fn, weights = tilework.VM(tilework.build(from_onnx(f.getvalue())))["main"], []
    for n in (9, 13, 17):
        x = inputs(n)
        with torch.no_grad():
            want = model(x).numpy()
        got = np.asarray(fn(x.numpy(), *weights))
        assert got.shape == want.shape
        assert float(np.abs(got - want).max() / np.abs(want).max()) <= 1e-4, f"{name} via {frontend} at size {n}"
