"""Verify the foundation on the testbed hosts: names, isolation, stand-ins."""
import json


def test_hostname_matches_inventory_name(host):
    assert host.check_output("hostname") == host.backend.host.name


def test_files_are_private_to_each_host(host):
    name = host.backend.host.name
    marker = f"/root/molecule-isolation-{name}"
    host.run(f"echo {name} > {marker}")
    listing = host.check_output("ls /root")
    others = [line for line in listing.split() if line.startswith("molecule-isolation-") and not line.endswith(name)]
    host.run(f"rm -f {marker}")
    assert others == []


def test_gpu_stand_in_reports_the_driver(host):
    out = host.check_output("nvidia-smi --query-gpu=name,driver_version --format=csv,noheader")
    assert out == "NVIDIA GB10, 580.159.03"


def test_the_hosts_own_dockerd_has_the_engine_image(host):
    assert host.check_output("docker info --format '{{.Driver}}'") == "overlay2"
    image = json.loads(host.check_output("docker image inspect dsv41-3x-spark:local"))[0]
    assert image["Config"]["Cmd"] == ["run"]


def test_systemctl_stand_in_manages_units(host):
    assert host.service("nvidia-clock-lock").is_enabled


def test_kernel_driver_and_firmware_packages_are_held(host):
    """site.yml holds them (roles/package_holds): apt upgrade leaves them where they are."""
    held = set(host.check_output("apt-mark showhold").split())
    installed = set(host.check_output("dpkg-query -W -f '${Package}\\n' 'linux-image-*nvidia*' "
                                      "'nvidia-driver-*' linux-firmware").split())
    assert installed and installed <= held, (installed, held)
