"""Reading config YAML strictly: a duplicated key is an error, not "last one wins".

PyYAML's safe loader silently keeps the last of two equal keys in a mapping, so
a config with ``lr`` written twice trains with whichever came second. Our loader
refuses it and names the key and both lines. Merge keys (``<<: *anchor``) may
still be overridden by explicit keys: that is what they are for.

Numbers in scientific notation are numbers: PyYAML implements YAML 1.1, whose
floats need a dot and a signed exponent, so ``lr: 1e-5`` (or ``3e3``,
``1.0e5``) would load as the text ``'1e-5'``. Our loader also resolves YAML
1.2's float syntax (its core schema), the way every ML config writes a learning
rate. Every YAML asyncrl reads - config files, a run's ``config.yaml``, a
checkpoint's copy, command-line override values - goes through this loader.
"""

from __future__ import annotations

import re
from typing import Any

import yaml

from asyncrl.errors import ConfigError

_MERGE_TAG = "tag:yaml.org,2002:merge"


class _StrictLoader(yaml.SafeLoader):
    source = "config"

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        first_line: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == _MERGE_TAG:
                continue
            key = self.construct_object(key_node, deep=True)
            try:
                earlier = first_line.get(key)
            except TypeError:  # an unhashable key: the base class reports it
                continue
            line = key_node.start_mark.line + 1
            if earlier is not None:
                raise ConfigError(
                    f"{self.source}: key {key!r} appears twice in the same block, on line "
                    f"{earlier} and on line {line}; YAML would silently keep the second. "
                    "Delete one of them"
                )
            first_line[key] = line
        return super().construct_mapping(node, deep=deep)


#: YAML 1.2's float (core schema). Appended after YAML 1.1's own resolvers, so it
#: decides only what they leave as text: ints, 1.1 floats (``0.5``, ``.inf``) and
#: timestamps resolve as before, and a scalar such as ``1e-5`` becomes a float.
_FLOAT_1_2 = re.compile(r"^[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?$")
_StrictLoader.add_implicit_resolver("tag:yaml.org,2002:float", _FLOAT_1_2,
                                    list("-+.0123456789"))


#: PyYAML problems that usually mean an unquoted value with a colon in it, or a
#: line indented differently from the keys beside it.
_COLON_HINT = (
    " Check the indentation at that line (keys of one block start in the same column), "
    "and quote a value that contains ': ' or ends with ':', e.g. "
    'target: "my_pkg.samplers:MySampler"'
)


def parse_yaml(text: str, source: str) -> Any:
    """Parse ``text`` with this module's loader; a syntax error raises PyYAML's own
    :class:`yaml.YAMLError` (for a caller with a message of its own), a duplicated
    key a :class:`ConfigError` naming ``source``."""
    # PyYAML names a string it parses "<unicode string>" in the line it points
    # at; the user needs the file (or override) that text came from.
    try:
        loader = _StrictLoader(text)
    except yaml.reader.ReaderError as exc:  # a character YAML cannot hold, found at once
        exc.name = source
        raise
    loader.name = loader.source = source
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()


def load_yaml(text: str, source: str) -> Any:
    """Parse ``text`` (from ``source``, named in errors) with duplicate keys refused."""
    try:
        return parse_yaml(text, source)
    except yaml.YAMLError as exc:
        text = str(exc)
        colon = "mapping values are not allowed" in text or "but found ':'" in text
        hint = _COLON_HINT if colon or "but got ':'" in text else ""
        raise ConfigError(f"{source}: not valid YAML ({exc}).{hint}") from None
