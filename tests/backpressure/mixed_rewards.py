"""A verifier that gives an untrained tiny model mixed rewards, so its steps train (and are measured)."""


def parity(completion: str, reference: str) -> float:
    """1.0 when the completion's code points sum to an even number: about half of random completions."""
    return float(sum(map(ord, completion)) % 2 == 0)
