# ---- the task's criteria
qs_expect_output --contains 'hello, reader' --matches '^hello, [a-z]+$'
