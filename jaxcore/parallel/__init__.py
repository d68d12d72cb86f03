"""Parallelism: the device meshes, built one way (`meshes`: ES's (pop, model) and GRPO's (data, fsdp),
multi-host start-up), where arrays live on them (`sharding`: tensor-parallel, FSDP and master layouts,
placement and gathers), the rows a process holds (`rows`) and the mesh's config sections (`config`).

May import: `jaxcore.inference` and the layers below it.
"""
