# -*- coding: utf-8 -*-
"""The body of the boot_log_info module (and of its deprecated alias boot_log_facts)."""
from __future__ import annotations

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.module_alias import warn_if_deprecated
from ansible.module_utils.sglang_log import LogNotText, parse_bytes, parse_file



def run_module(name: str) -> None:
    """Parse the log the module's arguments name and exit with its facts."""
    module = AnsibleModule(
        argument_spec=dict(
            path=dict(type="path"),
            content=dict(type="str"),
            markers=dict(type="list", elements="str", default=[]),
            max_errors=dict(type="int", default=100),
        ),
        mutually_exclusive=[("path", "content")],
        required_one_of=[("path", "content")],
        supports_check_mode=True,
    )
    params = module.params
    warn_if_deprecated(module, name)
    markers = params["markers"] or []
    if params["max_errors"] < 0:
        module.fail_json(msg=f"max_errors must be 0 or more, got {params['max_errors']}.")
    try:
        if params["path"] is not None:
            result = parse_file(params["path"], markers=markers, max_errors=params["max_errors"])
        else:
            data = params["content"].encode("utf-8", "surrogateescape")
            result = parse_bytes(data, markers=markers, max_errors=params["max_errors"], where="content")
    except FileNotFoundError:
        module.fail_json(msg=f"Boot log {params['path']} does not exist on this host; check the path "
                             f"(docker logs are saved by the engine role under the run directory).",
                         path=params["path"])
    except IsADirectoryError:
        module.fail_json(msg=f"Boot log {params['path']} is a directory; give the log file itself.",
                         path=params["path"])
    except PermissionError as exc:
        module.fail_json(msg=f"Cannot read boot log {params['path']}: {exc.strerror}; run with become "
                             f"or fix its permissions.", path=params["path"])
    except LogNotText as exc:
        module.fail_json(msg=f"{exc} Give {name} the plain-text log.", path=params["path"])
    except ValueError as exc:  # a bad marker
        module.fail_json(msg=f"Bad markers option: {exc}.", markers=markers)
    except OSError as exc:
        module.fail_json(msg=f"Cannot read boot log {params['path']}: {exc}.", path=params["path"])
    module.exit_json(changed=False, **result)
