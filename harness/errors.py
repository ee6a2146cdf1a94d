"""The one exception type that means "the user's input is wrong".

Anything raised as `UsageError` ends the program with exit status 2 and a single
line on stderr that names the problem and the fix (see `harness.train`).
"""


class UsageError(Exception):
  """Bad input from the user: a wrong binding, value, file or environment."""

  exit_code = 2
