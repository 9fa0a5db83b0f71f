"""What both protocol fronts (gRPC and remoting) share, below both of them: accounts and
signatures (``auth``), the names a client may use and what a request needs (``names``), and the
rules of a producer's message (``rules``).  The fronts decode a request, ask this one policy, and
call the same services."""
