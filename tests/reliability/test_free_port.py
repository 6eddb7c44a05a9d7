"""The MASTER_PORT kosmoss picks for its ranks is free and stays out of the kernel's ephemeral
range, where a connection's local port could take it before rank 0 binds it."""
import socket

from kosmoss.launch import ports


def test_a_picked_port_is_free_and_below_the_ephemeral_range():
    low, _ = ports.ephemeral_ports()
    picked = {ports.free_port() for _ in range(50)}
    assert all(ports.LOWEST_PICKED <= port < low for port in picked), picked
    assert ports.TORCHRUN_PORT not in picked
    assert len(picked) > 1  # drawn at random: two launches at once rarely meet
    for port in picked:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))


def _held_pair():
    """A listening socket on a port P whose neighbour P + 1 is free."""
    while True:
        held = socket.socket()
        held.bind(("", 0))
        held.listen()
        port = held.getsockname()[1]
        if port + 1 < 65536 and ports.port_is_free(port + 1):
            return held, port
        held.close()


def test_a_port_someone_listens_on_is_never_picked(monkeypatch):
    held, port = _held_pair()
    with held:
        monkeypatch.setattr(ports, "LOWEST_PICKED", port)
        monkeypatch.setattr(ports, "ephemeral_ports", lambda: (port + 2, 60999))
        assert {ports.free_port() for _ in range(20)} == {port + 1}


def test_with_no_room_below_the_range_the_kernel_picks(monkeypatch):
    monkeypatch.setattr(ports, "ephemeral_ports", lambda: (ports.LOWEST_PICKED, 60999))
    port = ports.free_port()
    assert port >= ports.LOWEST_PICKED and ports.port_is_free(port)


def test_the_range_is_read_from_the_kernel_or_the_default(tmp_path):
    tuned = tmp_path / "ip_local_port_range"
    tuned.write_text("20000\t40000\n")
    assert ports.ephemeral_ports(tuned) == (20000, 40000)
    tuned.write_text("not a range\n")
    assert ports.ephemeral_ports(tuned) == (32768, 60999)
    assert ports.ephemeral_ports(tmp_path / "absent") == (32768, 60999)
