"""Typed records for the modules `qnnctl env` loads, without importing `typing` at run time.

`eval "$(qnnctl env)"` runs in every shell's start-up file, and importing `typing` costs about
3 ms there, a third of starting Python. A `Record` subclass is what a `typing.NamedTuple`
subclass is: mypy reads it as one, and at run time it is built the way `typing` builds one, by
`collections.namedtuple`, with the same fields, defaults, docstring, methods and properties.
Modules on that path also take `TYPE_CHECKING` from here for imports that only mypy needs.
"""

from __future__ import annotations

from collections import namedtuple

__all__ = ["TYPE_CHECKING", "Record"]

# True for mypy, which reads any name TYPE_CHECKING so; False at run time, like typing's own.
TYPE_CHECKING = False

if TYPE_CHECKING:
    from typing import NamedTuple as Record
else:
    # What a record may not define, because namedtuple makes it: as typing.NamedTupleMeta.
    _MADE_BY_NAMEDTUPLE = frozenset({"__new__", "__init__", "__slots__", "__getnewargs__", "_fields",
                                     "_field_defaults", "_make", "_replace", "_asdict", "_source"})
    _NOT_COPIED = frozenset({"__module__", "__name__", "__annotations__"})

    class _RecordType(type):
        """Turns `class Name(Record): field: type = default ...` into a namedtuple class."""

        def __new__(mcls, name: str, bases: tuple[type, ...], namespace: dict[str, object]) -> type:
            if not bases:
                return super().__new__(mcls, name, bases, namespace)  # Record itself
            if bases != (Record,):
                raise TypeError(f"{name}: a record derives from Record alone")
            if "__annotations__" not in namespace and ("__annotate__" in namespace
                                                       or "__annotate_func__" in namespace):
                # Python 3.14 evaluates annotations lazily: fields are read as strings here.
                raise TypeError(f"{name}: a record's module needs `from __future__ import annotations`")
            fields = list(namespace.get("__annotations__", {}))
            defaults = [namespace[field] for field in fields if field in namespace]
            if any(field in namespace for field in fields[: len(fields) - len(defaults)]):
                raise TypeError(f"{name}: a field without a default follows one with a default")
            record = namedtuple(name, fields, defaults=defaults,
                                module=str(namespace["__module__"]))
            record.__annotations__ = namespace.get("__annotations__", {})
            for key, value in namespace.items():
                if key in _MADE_BY_NAMEDTUPLE:
                    raise AttributeError(f"{name}: a record cannot define {key}")
                if key not in _NOT_COPIED and key not in fields:
                    setattr(record, key, value)
            return record

        def __instancecheck__(cls, instance: object) -> bool:
            raise TypeError("Record is no class of instances; test for the record's own class")

    class Record(metaclass=_RecordType):
        """The base of a record: `class Version(Record): major: int ...`."""
