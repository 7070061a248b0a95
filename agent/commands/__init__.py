"""Click command groups. Each is thin: parse -> call a library function -> print text or --json."""
