"""Several devices on a machine that has one: a device-placement stub for the multi-device path
(`--device auto` spreading a model's layers over GPUs) where no second GPU is lent.

Every tensor lives on the CPU, but carries a virtual device, `cpu:1`, `cpu:2`, … (its `device`
reads so): a model's top-level modules are placed on them as accelerate's `device_map` places
them on GPUs (their parameters and buffers on that device, and their inputs moved there when
they are called, as accelerate's hooks do), `.to(device)` and a factory's `device=` move or
create a tensor there, and any operation that mixes tensors of two virtual devices raises the
error torch raises for two GPUs. A tensor with no virtual device (made on the host by
`torch.tensor(...)` and the like) mixes with any, as a CPU scalar or index does with a GPU's.
Values are computed as usual, so results must be the single-device ones exactly.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import torch
from torch import Tensor, nn
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten, tree_map

TAG = "_virtual_device"
DEVICE_GET = torch.Tensor.device.__get__
#: Operations that may take tensors of two devices (copies between them).
CROSSING = {torch.Tensor.copy_, torch.Tensor.__setitem__}


class DeviceMismatch(RuntimeError):
    """Two virtual devices met in one operation."""


def virtual(index: int) -> torch.device:
    return torch.device("cpu", index)


def tag_of(value: object) -> int | None:
    return getattr(value, TAG, None) if isinstance(value, Tensor) else None


def moved(tensor: Tensor, index: int | None) -> Tensor:
    """`tensor` on virtual device `index` (a new tensor object sharing its values, as a move
    makes a new tensor); itself when it is there already."""
    if tag_of(tensor) == index:
        return tensor
    alias = tensor.view_as(tensor) if index is not None else tensor.detach().clone()
    setattr(alias, TAG, index)
    return alias


def _target(value: object) -> int | None | bool:
    """The virtual device a `device=` / `.to(...)` argument names: an index, None for the host,
    False when it names no device."""
    if isinstance(value, str) and value.startswith("cpu"):
        value = torch.device(value)
    if isinstance(value, torch.device) and value.type == "cpu":
        return value.index if value.index else None
    if isinstance(value, Tensor):
        return tag_of(value)
    return False


class VirtualDevices(TorchFunctionMode):
    """The stub's rules (see the module's docstring)."""

    def __init__(self) -> None:
        super().__init__()
        self.operations = 0
        self.crossings = 0

    def __torch_function__(
        self,
        func: Any,
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: Mapping[str, Any] | None = None,
    ) -> Any:
        kwargs = dict(kwargs or {})
        if func == DEVICE_GET:
            index = tag_of(args[0])
            return virtual(index) if index else func(*args, **kwargs)
        target: int | None | bool = False
        if "device" in kwargs:
            target = _target(kwargs["device"])
            if target is not False:
                kwargs["device"] = "cpu"
        if func is torch.Tensor.to:
            rest = []
            for arg in args[1:]:
                found = _target(arg)
                if found is False:
                    rest.append(arg)
                else:
                    target = found
                    if isinstance(arg, Tensor):  # .to(other): its dtype too
                        rest.append(arg.dtype)
            args = (args[0], *rest)
        self.operations += 1
        inputs = {tag_of(leaf) for leaf in tree_flatten((args, kwargs))[0]} - {None}
        if len(inputs) > 1 and func not in CROSSING:
            names = ", ".join(f"cpu:{i}" for i in sorted(inputs))
            raise DeviceMismatch(
                f"Expected all tensors to be on the same device, but found at least two "
                f"devices, {names}! ({getattr(func, '__name__', func)})"
            )
        result = func(*args, **kwargs)
        if func in CROSSING:
            self.crossings += len(inputs) > 1
            return result
        if target is False:
            target = inputs.pop() if inputs else None
        elif target is not None or func is torch.Tensor.to:
            self.crossings += bool(inputs) and inputs != {target}
        if func is torch.Tensor.to:
            return moved(result, target)  # type: ignore[arg-type]
        if target is None:
            return result
        return tree_map(lambda r: _tagged(r, target), result)


def _tagged(value: Any, index: int) -> Any:
    if isinstance(value, Tensor) and tag_of(value) != index:
        setattr(value, TAG, index)
    return value


def _move_inputs(module: nn.Module, index: int) -> None:
    """As accelerate's AlignDevicesHook: the module's tensor arguments moved to its device."""
    forward = module.forward

    def placed(*args: Any, **kwargs: Any) -> Any:
        def move(value: Any) -> Any:
            return moved(value, index) if isinstance(value, Tensor) else value

        return forward(*tree_map(move, args), **tree_map(move, kwargs))

    module.forward = placed  # type: ignore[method-assign]


@contextmanager
def placed(model: nn.Module, device_map: Mapping[str, int]) -> Iterator[VirtualDevices]:
    """Within the block, `model`'s modules named in `device_map` (module path → virtual device
    index ≥ 1) sit on those devices and every operation is checked; on exit the model is as it
    was (its tensors' virtual devices and its modules' forwards removed)."""
    wrapped = []
    for path, index in device_map.items():
        module = model.get_submodule(path)
        for tensor in [*module.parameters(), *module.buffers()]:
            setattr(tensor, TAG, index)
        _move_inputs(module, index)
        wrapped.append(module)
    mode = VirtualDevices()
    try:
        with mode:
            yield mode
    finally:
        for module in wrapped:
            del module.forward
            for tensor in [*module.parameters(), *module.buffers()]:
                if hasattr(tensor, TAG):
                    delattr(tensor, TAG)
