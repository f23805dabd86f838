# ---- the task's criteria
qs_serve python3 -m http.server $QS_PORT --bind 127.0.0.1
qs_wait_http /status.json --status 200 --timeout 20 --contains hello --json ready=true --json count=42 --json 'greeting=hello, reader'
