def busy(n):
    """Pure-Python arithmetic: the thread that runs it holds the GIL all the time."""
    total = 0
    for i in range(n):
        total += i * i % 7
    return total
