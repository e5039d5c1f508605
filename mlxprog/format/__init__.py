"""Format v1: the program document (:mod:`.program`), its full JSON Schema
with every op's attributes (:mod:`.schema`) and structural step paths
(:mod:`.paths`)."""
