"""Converters of ``aten.lstm``, ``aten.gru`` and ``aten.rnn_tanh``/``rnn_relu`` (the ``.input``
overloads torch.export emits for ``nn.LSTM``/``GRU``/``RNN``): every layer and direction is one
``rnn`` op, a loop over the (possibly symbolic) sequence length inside one kernel, after one
matrix product that projects every step's input at once. torch's gate order is the op's."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

from tilework import op
from tilework.errors import UnsupportedError
from tilework.frontend.torch.registry import converter
from tilework.ir.graph import Expr, TupleGetItem
from tilework.op import rnn

if TYPE_CHECKING:
    from tilework.frontend.torch.translator import Translator


def _layers(t: Translator, cell: str, x: Expr, h0: Expr, c0: Expr | None, params: Sequence[Any], has_biases: bool, num_layers: int, bidirectional: bool, batch_first: bool) -> tuple[Expr, Expr, Expr | None]:
    dirs = 2 if bidirectional else 1
    per = 4 if has_biases else 2
    if len(params) != num_layers * dirs * per:
        raise UnsupportedError(f"{cell}: {len(params)} weights for {num_layers} layer(s) x {dirs} direction(s) (projections, proj_size > 0, are not supported)")
    if batch_first:
        x = t.emit(op.permute_dims(x, (1, 0, 2)))
    steps, batch, _ = t.shape(x)
    hidden = t.shape(params[1])[1]
    lens = t.emit(op.add(t.emit(op.full((batch,), 0, "int64")), t.tensor(steps, "int64")))
    hs: list[Expr] = []
    cs: list[Expr] = []
    for layer in range(num_layers):
        ys = []
        for d in range(dirs):
            k = layer * dirs + d
            w_ih, w_hh = params[k * per], params[k * per + 1]
            xw = t.emit(op.matmul(x, t.emit(op.permute_dims(w_ih, (1, 0)))))
            if has_biases:
                xw = t.emit(op.add(xw, params[k * per + 2]))
                rb = params[k * per + 3]
            else:
                rb = t.ones((t.shape(w_hh)[0],), t.dtype(x), 0.0)
            state = t.emit(op.squeeze(t.emit(op.strided_slice(h0, (0,), (k,), (k + 1,))), 0))
            c_state, peep = None, None
            if cell == "lstm":
                assert c0 is not None
                c_state = t.emit(op.squeeze(t.emit(op.strided_slice(c0, (0,), (k,), (k + 1,))), 0))
                peep = t.ones((3 * hidden,), t.dtype(x), 0.0)
            out = t.emit(rnn.rnn(xw, w_hh, rb, state, lens, cell, c0=c_state, peep=peep, reverse=d == 1))
            ys.append(t.emit(TupleGetItem(out, 0)))
            hs.append(t.emit(op.expand_dims(t.emit(TupleGetItem(out, 1)), 0)))
            if cell == "lstm":
                cs.append(t.emit(op.expand_dims(t.emit(TupleGetItem(out, 2)), 0)))
        x = ys[0] if dirs == 1 else t.emit(op.concat(ys, 2))
    y = t.emit(op.permute_dims(x, (1, 0, 2))) if batch_first else x
    h = hs[0] if len(hs) == 1 else t.emit(op.concat(hs, 0))
    c = (cs[0] if len(cs) == 1 else t.emit(op.concat(cs, 0))) if cs else None
    return y, h, c


def _check_eval(cell: str, dropout: float, train: bool, num_layers: int) -> None:
    if train and dropout and num_layers > 1:
        raise UnsupportedError(f"{cell} with dropout in training mode is not supported")


@converter("lstm.input")
def _lstm(t: Translator, node: Any, x: Any, hx: Sequence[Any], params: Sequence[Any], has_biases: bool, num_layers: int, dropout: float, train: bool, bidirectional: bool, batch_first: bool) -> tuple[Expr | None, ...]:
    _check_eval("lstm", dropout, train, num_layers)
    y, h, c = _layers(t, "lstm", x, hx[0], hx[1], params, has_biases, num_layers, bidirectional, batch_first)
    return y, h, c


def _simple(cell: str) -> Any:
    def convert(t: Translator, node: Any, x: Any, hx: Any, params: Sequence[Any], has_biases: bool, num_layers: int, dropout: float, train: bool, bidirectional: bool, batch_first: bool) -> tuple[Expr | None, ...]:
        _check_eval(cell, dropout, train, num_layers)
        y, h, _ = _layers(t, cell, x, hx, None, params, has_biases, num_layers, bidirectional, batch_first)
        return y, h

    return convert


converter("gru.input")(_simple("gru"))
converter("rnn_tanh.input")(_simple("rnn_tanh"))
converter("rnn_relu.input")(_simple("rnn_relu"))
