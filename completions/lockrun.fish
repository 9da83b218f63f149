# Print an optspec for argparse to handle cmd's options that are independent of any subcommand.
function __fish_lockrun_global_optspecs
    string join \n name= s/shared x/exclusive b/backend= prefix= dir= db= redis-url= redis-replicas= postgres-url= etcd-endpoints= s3-url= s3-endpoint= p/parallelism= n/no-wait w/timeout= initial-delay= max-delay= backoff-multiplier= ttl= min-hold= max-runtime= kill-grace= E/conflict-exit-code= c/command= note= record-command v/verbose q/quiet log-format= h/help V/version
end

function __fish_lockrun_needs_command
    # Figure out if the current invocation already has a command.
    set -l cmd (commandline -opc)
    set -e cmd[1]
    # Past `--` the words are the command's (below), not lockrun's.
    contains -- -- $cmd; and return 1
    argparse -s (__fish_lockrun_global_optspecs) -- $cmd 2>/dev/null
    or return
    if set -q argv[1]
        # Also print the command, so this can be used to figure out what it is.
        echo $argv[1]
        return 1
    end
    return 0
end

function __fish_lockrun_using_subcommand
    set -l cmd (__fish_lockrun_needs_command)
    test -z "$cmd"
    and return 1
    contains -- $cmd[1] $argv
end

complete -c lockrun -n "__fish_lockrun_needs_command" -l name -d 'The lock\'s name: 1 to 200 bytes, no control characters; several --name hold them all' -r
complete -c lockrun -n "__fish_lockrun_needs_command" -s b -l backend -d 'Where the lock lives (in any case: sqlite, SQLite)' -r -f -a "file\t''
sqlite\t''
redis\t''
postgres\t''
etcd\t''
s3\t''"
complete -c lockrun -n "__fish_lockrun_needs_command" -l prefix -d 'Key prefix on redis (keys start with PREFIX:) and etcd (/PREFIX/); schema on postgres' -r
complete -c lockrun -n "__fish_lockrun_needs_command" -l dir -d 'File backend\'s directory [default: /run/lock/lockrun-$UID, else /var/tmp/lockrun-$UID; the same in every session]' -r -F
complete -c lockrun -n "__fish_lockrun_needs_command" -l db -d 'SQLite database [default: $XDG_STATE_HOME/lockrun/locks.sqlite3, else ~/.local/state/lockrun/locks.sqlite3]' -r -F
complete -c lockrun -n "__fish_lockrun_needs_command" -l redis-url -d 'Redis: redis://[user:pass@]host:port[/db], rediss:// (TLS), redis+unix:///path, redis+sentinel://[user:pass@]HOST:PORT[,HOST:PORT...]/PRIMARY[/db] or redis+cluster://[user:pass@]HOST:PORT[,HOST:PORT...]' -r
complete -c lockrun -n "__fish_lockrun_needs_command" -l redis-replicas -d 'Replicas that must acknowledge an acquisition or renewal (WAIT) before it counts [default: 1 with redis+sentinel://, else 0]' -r
complete -c lockrun -n "__fish_lockrun_needs_command" -l postgres-url -d 'PostgreSQL server: postgres://[user[:pass]@]host[:port]/db[?sslmode=...] or a key=value conninfo string [default: libpq\'s: PGHOST, PGPORT, PGUSER, PGPASSWORD, PGDATABASE, the local socket]' -r
complete -c lockrun -n "__fish_lockrun_needs_command" -l etcd-endpoints -d 'etcd v3 endpoints, comma-separated: http://[user:pass@]host:port, https:// for TLS' -r
complete -c lockrun -n "__fish_lockrun_needs_command" -l s3-url -d 'The bucket and key prefix of the S3 backend: s3://BUCKET[/PREFIX]' -r
complete -c lockrun -n "__fish_lockrun_needs_command" -l s3-endpoint -d 'An S3-compatible endpoint (MinIO, R2, Ceph, SeaweedFS...) instead of AWS [env: AWS_ENDPOINT_URL_S3, AWS_ENDPOINT_URL]' -r
complete -c lockrun -n "__fish_lockrun_needs_command" -s p -l parallelism -d 'How many holders at once (slots), 1 to 1024; the same for every run of a name while it is held or waited for' -r
complete -c lockrun -n "__fish_lockrun_needs_command" -s w -l timeout -d 'Longest wait for a slot; inf waits forever' -r
complete -c lockrun -n "__fish_lockrun_needs_command" -l initial-delay -d 'First retry delay when polling' -r
complete -c lockrun -n "__fish_lockrun_needs_command" -l max-delay -d 'Cap on the retry delay' -r
complete -c lockrun -n "__fish_lockrun_needs_command" -l backoff-multiplier -d 'Growth of the retry delay per retry (>= 1)' -r
complete -c lockrun -n "__fish_lockrun_needs_command" -l ttl -d 'Lease length on every backend but file; renewed every TTL/3 while the command runs' -r
complete -c lockrun -n "__fish_lockrun_needs_command" -l min-hold -d 'Keep the slot taken at least this long after acquiring' -r
complete -c lockrun -n "__fish_lockrun_needs_command" -l max-runtime -d 'Stop the command after this long (exit 124); 0 means no limit' -r
complete -c lockrun -n "__fish_lockrun_needs_command" -l kill-grace -d 'Time between SIGTERM and SIGKILL when lockrun stops the command [default: 10s, at most TTL/3 on every backend but file]' -r
complete -c lockrun -n "__fish_lockrun_needs_command" -s E -l conflict-exit-code -d 'Exit status when no slot was acquired, 0 to 255' -r
complete -c lockrun -n "__fish_lockrun_needs_command" -s c -l command -d 'Run this string with /bin/sh -c instead of COMMAND ARGS' -r
complete -c lockrun -n "__fish_lockrun_needs_command" -l note -d 'What status and the events say about this run, beside its program\'s name, pid, host and user' -r
complete -c lockrun -n "__fish_lockrun_needs_command" -l log-format -d 'Diagnostics as text lines or one JSON event per line' -r -f -a "text\t''
json\t''"
complete -c lockrun -n "__fish_lockrun_needs_command" -s s -l shared -d 'Hold the name in shared mode: shared holders hold it together, an exclusive holder alone; only with -p 1'
complete -c lockrun -n "__fish_lockrun_needs_command" -s x -l exclusive -d 'The default mode, a holder alone: accepted so that lines ported from flock(1) (-x, -e) run unchanged; not with -s'
complete -c lockrun -n "__fish_lockrun_needs_command" -s n -l no-wait -d 'Give up at once if no slot is free (same as --timeout 0); trouble with the store is ridden out for 10 s'
complete -c lockrun -n "__fish_lockrun_needs_command" -l record-command -d 'Record the whole command line in the store for status, not only the program\'s name'
complete -c lockrun -n "__fish_lockrun_needs_command" -s v -l verbose -d 'More diagnostics on stderr: waiting, acquired, renewals, release'
complete -c lockrun -n "__fish_lockrun_needs_command" -s q -l quiet -d 'No diagnostics at all'
complete -c lockrun -n "__fish_lockrun_needs_command" -s h -l help -d 'Print help'
complete -c lockrun -n "__fish_lockrun_needs_command" -s V -l version -d 'Print version'
complete -c lockrun -n "__fish_lockrun_needs_command" -a "status" -d 'List who holds a lock (every name when NAME is omitted)'
complete -c lockrun -n "__fish_lockrun_needs_command" -a "release" -d 'Break a lease that is known to be dead (every backend but file)'
complete -c lockrun -n "__fish_lockrun_needs_command" -a "check" -d 'Probe the store without taking a lock: reachable, and safe to lock on'
complete -c lockrun -n "__fish_lockrun_needs_command" -a "help" -d 'Print this message or the help of the given subcommand(s)'
complete -c lockrun -n "__fish_lockrun_using_subcommand status" -s b -l backend -d 'Where the lock lives (in any case: sqlite, SQLite)' -r -f -a "file\t''
sqlite\t''
redis\t''
postgres\t''
etcd\t''
s3\t''"
complete -c lockrun -n "__fish_lockrun_using_subcommand status" -l prefix -d 'Key prefix on redis (keys start with PREFIX:) and etcd (/PREFIX/); schema on postgres' -r
complete -c lockrun -n "__fish_lockrun_using_subcommand status" -l dir -d 'File backend\'s directory [default: /run/lock/lockrun-$UID, else /var/tmp/lockrun-$UID; the same in every session]' -r -F
complete -c lockrun -n "__fish_lockrun_using_subcommand status" -l db -d 'SQLite database [default: $XDG_STATE_HOME/lockrun/locks.sqlite3, else ~/.local/state/lockrun/locks.sqlite3]' -r -F
complete -c lockrun -n "__fish_lockrun_using_subcommand status" -l redis-url -d 'Redis: redis://[user:pass@]host:port[/db], rediss:// (TLS), redis+unix:///path, redis+sentinel://[user:pass@]HOST:PORT[,HOST:PORT...]/PRIMARY[/db] or redis+cluster://[user:pass@]HOST:PORT[,HOST:PORT...]' -r
complete -c lockrun -n "__fish_lockrun_using_subcommand status" -l redis-replicas -d 'Replicas that must acknowledge an acquisition or renewal (WAIT) before it counts [default: 1 with redis+sentinel://, else 0]' -r
complete -c lockrun -n "__fish_lockrun_using_subcommand status" -l postgres-url -d 'PostgreSQL server: postgres://[user[:pass]@]host[:port]/db[?sslmode=...] or a key=value conninfo string [default: libpq\'s: PGHOST, PGPORT, PGUSER, PGPASSWORD, PGDATABASE, the local socket]' -r
complete -c lockrun -n "__fish_lockrun_using_subcommand status" -l etcd-endpoints -d 'etcd v3 endpoints, comma-separated: http://[user:pass@]host:port, https:// for TLS' -r
complete -c lockrun -n "__fish_lockrun_using_subcommand status" -l s3-url -d 'The bucket and key prefix of the S3 backend: s3://BUCKET[/PREFIX]' -r
complete -c lockrun -n "__fish_lockrun_using_subcommand status" -l s3-endpoint -d 'An S3-compatible endpoint (MinIO, R2, Ceph, SeaweedFS...) instead of AWS [env: AWS_ENDPOINT_URL_S3, AWS_ENDPOINT_URL]' -r
complete -c lockrun -n "__fish_lockrun_using_subcommand status" -l log-format -d 'Diagnostics as text lines or one JSON event per line' -r -f -a "text\t''
json\t''"
complete -c lockrun -n "__fish_lockrun_using_subcommand status" -l json -d 'Print a JSON array instead of a table'
complete -c lockrun -n "__fish_lockrun_using_subcommand status" -s v -l verbose -d 'More diagnostics on stderr: waiting, acquired, renewals, release'
complete -c lockrun -n "__fish_lockrun_using_subcommand status" -s q -l quiet -d 'No diagnostics at all'
complete -c lockrun -n "__fish_lockrun_using_subcommand status" -s h -l help -d 'Print help'
complete -c lockrun -n "__fish_lockrun_using_subcommand release" -l slot -d 'Only this slot (all of the name\'s slots when omitted)' -r
complete -c lockrun -n "__fish_lockrun_using_subcommand release" -s b -l backend -d 'Where the lock lives (in any case: sqlite, SQLite)' -r -f -a "file\t''
sqlite\t''
redis\t''
postgres\t''
etcd\t''
s3\t''"
complete -c lockrun -n "__fish_lockrun_using_subcommand release" -l prefix -d 'Key prefix on redis (keys start with PREFIX:) and etcd (/PREFIX/); schema on postgres' -r
complete -c lockrun -n "__fish_lockrun_using_subcommand release" -l dir -d 'File backend\'s directory [default: /run/lock/lockrun-$UID, else /var/tmp/lockrun-$UID; the same in every session]' -r -F
complete -c lockrun -n "__fish_lockrun_using_subcommand release" -l db -d 'SQLite database [default: $XDG_STATE_HOME/lockrun/locks.sqlite3, else ~/.local/state/lockrun/locks.sqlite3]' -r -F
complete -c lockrun -n "__fish_lockrun_using_subcommand release" -l redis-url -d 'Redis: redis://[user:pass@]host:port[/db], rediss:// (TLS), redis+unix:///path, redis+sentinel://[user:pass@]HOST:PORT[,HOST:PORT...]/PRIMARY[/db] or redis+cluster://[user:pass@]HOST:PORT[,HOST:PORT...]' -r
complete -c lockrun -n "__fish_lockrun_using_subcommand release" -l redis-replicas -d 'Replicas that must acknowledge an acquisition or renewal (WAIT) before it counts [default: 1 with redis+sentinel://, else 0]' -r
complete -c lockrun -n "__fish_lockrun_using_subcommand release" -l postgres-url -d 'PostgreSQL server: postgres://[user[:pass]@]host[:port]/db[?sslmode=...] or a key=value conninfo string [default: libpq\'s: PGHOST, PGPORT, PGUSER, PGPASSWORD, PGDATABASE, the local socket]' -r
complete -c lockrun -n "__fish_lockrun_using_subcommand release" -l etcd-endpoints -d 'etcd v3 endpoints, comma-separated: http://[user:pass@]host:port, https:// for TLS' -r
complete -c lockrun -n "__fish_lockrun_using_subcommand release" -l s3-url -d 'The bucket and key prefix of the S3 backend: s3://BUCKET[/PREFIX]' -r
complete -c lockrun -n "__fish_lockrun_using_subcommand release" -l s3-endpoint -d 'An S3-compatible endpoint (MinIO, R2, Ceph, SeaweedFS...) instead of AWS [env: AWS_ENDPOINT_URL_S3, AWS_ENDPOINT_URL]' -r
complete -c lockrun -n "__fish_lockrun_using_subcommand release" -l log-format -d 'Diagnostics as text lines or one JSON event per line' -r -f -a "text\t''
json\t''"
complete -c lockrun -n "__fish_lockrun_using_subcommand release" -l force -d 'Required: breaking a live holder\'s lease lets a second holder in'
complete -c lockrun -n "__fish_lockrun_using_subcommand release" -s v -l verbose -d 'More diagnostics on stderr: waiting, acquired, renewals, release'
complete -c lockrun -n "__fish_lockrun_using_subcommand release" -s q -l quiet -d 'No diagnostics at all'
complete -c lockrun -n "__fish_lockrun_using_subcommand release" -s h -l help -d 'Print help'
complete -c lockrun -n "__fish_lockrun_using_subcommand check" -s b -l backend -d 'Where the lock lives (in any case: sqlite, SQLite)' -r -f -a "file\t''
sqlite\t''
redis\t''
postgres\t''
etcd\t''
s3\t''"
complete -c lockrun -n "__fish_lockrun_using_subcommand check" -l prefix -d 'Key prefix on redis (keys start with PREFIX:) and etcd (/PREFIX/); schema on postgres' -r
complete -c lockrun -n "__fish_lockrun_using_subcommand check" -l dir -d 'File backend\'s directory [default: /run/lock/lockrun-$UID, else /var/tmp/lockrun-$UID; the same in every session]' -r -F
complete -c lockrun -n "__fish_lockrun_using_subcommand check" -l db -d 'SQLite database [default: $XDG_STATE_HOME/lockrun/locks.sqlite3, else ~/.local/state/lockrun/locks.sqlite3]' -r -F
complete -c lockrun -n "__fish_lockrun_using_subcommand check" -l redis-url -d 'Redis: redis://[user:pass@]host:port[/db], rediss:// (TLS), redis+unix:///path, redis+sentinel://[user:pass@]HOST:PORT[,HOST:PORT...]/PRIMARY[/db] or redis+cluster://[user:pass@]HOST:PORT[,HOST:PORT...]' -r
complete -c lockrun -n "__fish_lockrun_using_subcommand check" -l redis-replicas -d 'Replicas that must acknowledge an acquisition or renewal (WAIT) before it counts [default: 1 with redis+sentinel://, else 0]' -r
complete -c lockrun -n "__fish_lockrun_using_subcommand check" -l postgres-url -d 'PostgreSQL server: postgres://[user[:pass]@]host[:port]/db[?sslmode=...] or a key=value conninfo string [default: libpq\'s: PGHOST, PGPORT, PGUSER, PGPASSWORD, PGDATABASE, the local socket]' -r
complete -c lockrun -n "__fish_lockrun_using_subcommand check" -l etcd-endpoints -d 'etcd v3 endpoints, comma-separated: http://[user:pass@]host:port, https:// for TLS' -r
complete -c lockrun -n "__fish_lockrun_using_subcommand check" -l s3-url -d 'The bucket and key prefix of the S3 backend: s3://BUCKET[/PREFIX]' -r
complete -c lockrun -n "__fish_lockrun_using_subcommand check" -l s3-endpoint -d 'An S3-compatible endpoint (MinIO, R2, Ceph, SeaweedFS...) instead of AWS [env: AWS_ENDPOINT_URL_S3, AWS_ENDPOINT_URL]' -r
complete -c lockrun -n "__fish_lockrun_using_subcommand check" -l log-format -d 'Diagnostics as text lines or one JSON event per line' -r -f -a "text\t''
json\t''"
complete -c lockrun -n "__fish_lockrun_using_subcommand check" -s v -l verbose -d 'More diagnostics on stderr: waiting, acquired, renewals, release'
complete -c lockrun -n "__fish_lockrun_using_subcommand check" -s q -l quiet -d 'No diagnostics at all'
complete -c lockrun -n "__fish_lockrun_using_subcommand check" -s h -l help -d 'Print help'
complete -c lockrun -n "__fish_lockrun_using_subcommand help; and not __fish_seen_subcommand_from status release check help" -f -a "status" -d 'List who holds a lock (every name when NAME is omitted)'
complete -c lockrun -n "__fish_lockrun_using_subcommand help; and not __fish_seen_subcommand_from status release check help" -f -a "release" -d 'Break a lease that is known to be dead (every backend but file)'
complete -c lockrun -n "__fish_lockrun_using_subcommand help; and not __fish_seen_subcommand_from status release check help" -f -a "check" -d 'Probe the store without taking a lock: reachable, and safe to lock on'
complete -c lockrun -n "__fish_lockrun_using_subcommand help; and not __fish_seen_subcommand_from status release check help" -f -a "help" -d 'Print this message or the help of the given subcommand(s)'

# Past `--` the words are the command's: complete them as fish would.
function __fish_lockrun_after_dashes
    set -l words (commandline -opc) (commandline -ct)
    set -l dashes (contains -i -- -- $words)
    __fish_complete_subcommand --commandline $words[(math $dashes + 1)..-1]
end
complete -c lockrun -n 'contains -- -- (commandline -opc)' -f -a '(__fish_lockrun_after_dashes)'
