"""The engine: the dispatcher's loop (``dispatcher``) and its parts: the two ways a round delivers
(``strategies``), what happens to a failed forward (``failures``), one reading of a transport's
answers (``triage``), the store and transport calls with their deadlines and circuit breakers
(``calls``, ``circuit``, ``deadline``, ``outages``), finding the message that breaks a connection
(``pinpoint``), the wake-ups (``wakeups``), and the events every sink observes (``observe``,
``sinks``, ``summary``). It receives stores and transports as objects and never imports a backend.
"""
