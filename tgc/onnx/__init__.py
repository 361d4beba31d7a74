"""ONNX in: a ModelProto translated into a readable `.tg` program plus its weights (`tgc.onnx.translate`).

Contract: `read_model(path)` gives a checked `onnx.ModelProto` or a `TgcError` (exit 2) saying why not (not
ONNX, the checker's complaint); `translate(model)` gives a `Translation`: the `.tg` source, the weights (the
initializers and any constant the program needs, keyed by their `.tg` names, in their declared dtypes) and the
map between ONNX names and `.tg` names of the inputs and outputs. An op, attribute or dtype tgc does not support
is a `TgcError` naming the model file, the op, the node and the opset, raised before anything runs; a source
error in the translated text names its node too (`at_node`). This package is a front
end (layer 2): it knows nothing of devices; `tgc.api.load` turns a translation into a `Program`.
"""

from tgc.onnx.core import NeedDims, NeedHost, NeedStatic
from tgc.onnx.translate import Translation, at_node, inspect_model, read_model, supported_ops, translate

__all__ = ["NeedDims", "NeedHost", "NeedStatic", "Translation", "at_node", "inspect_model", "read_model",
           "supported_ops", "translate"]
