"""Commands over every node of an inventory that are not a run: `orch exec`, `orch sync` and
`orch image push`.

- `exec.py`  one command on every node in parallel over the transport; every node's answer
             collected (`ExecReport`), grouped by identical output, the worst exit code
- `rsync.py` pure: the ssh command (the inventory's user, port, identity, known_hosts, host-key
             policy, gateway) and the rsync argv for one node; reading rsync's itemized output
- `sync.py`  runs those rsync commands, bounded in parallel, into a `SyncReport`
- `image.py` a container image onto every node without a registry: exported once, streamed into
             each node's runtime, skipped where the node holds its ID, the ID checked after loading

Like the rest of the library they print nothing: `cli/render/` shows what they return.
"""
