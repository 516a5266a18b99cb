"""Class 7, raw terminal bytes: an error message carrying ANSI colour and cursor codes, an OSC 52
sequence that would put a command on the user's clipboard, a bell and a bidi override, which a
harness that prints the candidate's message raw would pass to the user's terminal."""

raise RuntimeError("\x1b[2J\x1b[31mcleared\x1b]52;c;cm0gLXJmIH4K\x07 \x07 \u202egnp.exe\u202c done\r\nnext line")


def custom_kernel(data):
    return data
