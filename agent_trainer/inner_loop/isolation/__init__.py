"""Child processes and what they may reach: the one launcher (launcher.py), the bubblewrap sandbox, agent rewards in
a host of their own, the contamination check."""
