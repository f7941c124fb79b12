%% The indexes of the receiver pool's shared counters (one array for the
%% node, made by ecall_receiver_sup:init/1): ecall_receiver and
%% ecall_request (the replay) add to them,
%% ecall_receiver_sup:counts/0 reads them by name. Nothing else knows them.
-define(BATCHES, 1).
-define(REQUESTS, 2).
-define(MALFORMED, 3).
-define(DEAD_LETTERS, 4).
-define(SPAWN_FAILED, 5).
-define(LATE_REPLIES, 6).
-define(DUPLICATES, 7).
-define(RESUMES, 8).
-define(ACKS, 9).
-define(COUNTERS, 9).
