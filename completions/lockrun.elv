
use builtin;
use str;

set edit:completion:arg-completer[lockrun] = {|@words|
    fn spaces {|n|
        builtin:repeat $n ' ' | str:join ''
    }
    fn cand {|text desc|
        edit:complex-candidate $text &display=$text' '(spaces (- 14 (wcswidth $text)))$desc
    }
    var command = 'lockrun'
    for word $words[1..-1] {
        if (str:has-prefix $word '-') {
            break
        }
        set command = $command';'$word
    }
    var completions = [
        &'lockrun'= {
            cand --name 'The lock''s name: 1 to 200 bytes, no control characters; several --name hold them all'
            cand -b 'Where the lock lives (in any case: sqlite, SQLite)'
            cand --backend 'Where the lock lives (in any case: sqlite, SQLite)'
            cand --prefix 'Key prefix on redis (keys start with PREFIX:) and etcd (/PREFIX/); schema on postgres'
            cand --dir 'File backend''s directory [default: /run/lock/lockrun-$UID, else /var/tmp/lockrun-$UID; the same in every session]'
            cand --db 'SQLite database [default: $XDG_STATE_HOME/lockrun/locks.sqlite3, else ~/.local/state/lockrun/locks.sqlite3]'
            cand --redis-url 'Redis: redis://[user:pass@]host:port[/db], rediss:// (TLS), redis+unix:///path, redis+sentinel://[user:pass@]HOST:PORT[,HOST:PORT...]/PRIMARY[/db] or redis+cluster://[user:pass@]HOST:PORT[,HOST:PORT...]'
            cand --redis-replicas 'Replicas that must acknowledge an acquisition or renewal (WAIT) before it counts [default: 1 with redis+sentinel://, else 0]'
            cand --postgres-url 'PostgreSQL server: postgres://[user[:pass]@]host[:port]/db[?sslmode=...] or a key=value conninfo string [default: libpq''s: PGHOST, PGPORT, PGUSER, PGPASSWORD, PGDATABASE, the local socket]'
            cand --etcd-endpoints 'etcd v3 endpoints, comma-separated: http://[user:pass@]host:port, https:// for TLS'
            cand --s3-url 'The bucket and key prefix of the S3 backend: s3://BUCKET[/PREFIX]'
            cand --s3-endpoint 'An S3-compatible endpoint (MinIO, R2, Ceph, SeaweedFS...) instead of AWS [env: AWS_ENDPOINT_URL_S3, AWS_ENDPOINT_URL]'
            cand -p 'How many holders at once (slots), 1 to 1024; the same for every run of a name while it is held or waited for'
            cand --parallelism 'How many holders at once (slots), 1 to 1024; the same for every run of a name while it is held or waited for'
            cand -w 'Longest wait for a slot; inf waits forever'
            cand --timeout 'Longest wait for a slot; inf waits forever'
            cand --initial-delay 'First retry delay when polling'
            cand --max-delay 'Cap on the retry delay'
            cand --backoff-multiplier 'Growth of the retry delay per retry (>= 1)'
            cand --ttl 'Lease length on every backend but file; renewed every TTL/3 while the command runs'
            cand --min-hold 'Keep the slot taken at least this long after acquiring'
            cand --max-runtime 'Stop the command after this long (exit 124); 0 means no limit'
            cand --kill-grace 'Time between SIGTERM and SIGKILL when lockrun stops the command [default: 10s, at most TTL/3 on every backend but file]'
            cand -E 'Exit status when no slot was acquired, 0 to 255'
            cand --conflict-exit-code 'Exit status when no slot was acquired, 0 to 255'
            cand -c 'Run this string with /bin/sh -c instead of COMMAND ARGS'
            cand --command 'Run this string with /bin/sh -c instead of COMMAND ARGS'
            cand --note 'What status and the events say about this run, beside its program''s name, pid, host and user'
            cand --log-format 'Diagnostics as text lines or one JSON event per line'
            cand -s 'Hold the name in shared mode: shared holders hold it together, an exclusive holder alone; only with -p 1'
            cand --shared 'Hold the name in shared mode: shared holders hold it together, an exclusive holder alone; only with -p 1'
            cand -x 'The default mode, a holder alone: accepted so that lines ported from flock(1) (-x, -e) run unchanged; not with -s'
            cand --exclusive 'The default mode, a holder alone: accepted so that lines ported from flock(1) (-x, -e) run unchanged; not with -s'
            cand -n 'Give up at once if no slot is free (same as --timeout 0); trouble with the store is ridden out for 10 s'
            cand --no-wait 'Give up at once if no slot is free (same as --timeout 0); trouble with the store is ridden out for 10 s'
            cand --record-command 'Record the whole command line in the store for status, not only the program''s name'
            cand -v 'More diagnostics on stderr: waiting, acquired, renewals, release'
            cand --verbose 'More diagnostics on stderr: waiting, acquired, renewals, release'
            cand -q 'No diagnostics at all'
            cand --quiet 'No diagnostics at all'
            cand -h 'Print help'
            cand --help 'Print help'
            cand -V 'Print version'
            cand --version 'Print version'
            cand status 'List who holds a lock (every name when NAME is omitted)'
            cand release 'Break a lease that is known to be dead (every backend but file)'
            cand check 'Probe the store without taking a lock: reachable, and safe to lock on'
            cand help 'Print this message or the help of the given subcommand(s)'
        }
        &'lockrun;status'= {
            cand -b 'Where the lock lives (in any case: sqlite, SQLite)'
            cand --backend 'Where the lock lives (in any case: sqlite, SQLite)'
            cand --prefix 'Key prefix on redis (keys start with PREFIX:) and etcd (/PREFIX/); schema on postgres'
            cand --dir 'File backend''s directory [default: /run/lock/lockrun-$UID, else /var/tmp/lockrun-$UID; the same in every session]'
            cand --db 'SQLite database [default: $XDG_STATE_HOME/lockrun/locks.sqlite3, else ~/.local/state/lockrun/locks.sqlite3]'
            cand --redis-url 'Redis: redis://[user:pass@]host:port[/db], rediss:// (TLS), redis+unix:///path, redis+sentinel://[user:pass@]HOST:PORT[,HOST:PORT...]/PRIMARY[/db] or redis+cluster://[user:pass@]HOST:PORT[,HOST:PORT...]'
            cand --redis-replicas 'Replicas that must acknowledge an acquisition or renewal (WAIT) before it counts [default: 1 with redis+sentinel://, else 0]'
            cand --postgres-url 'PostgreSQL server: postgres://[user[:pass]@]host[:port]/db[?sslmode=...] or a key=value conninfo string [default: libpq''s: PGHOST, PGPORT, PGUSER, PGPASSWORD, PGDATABASE, the local socket]'
            cand --etcd-endpoints 'etcd v3 endpoints, comma-separated: http://[user:pass@]host:port, https:// for TLS'
            cand --s3-url 'The bucket and key prefix of the S3 backend: s3://BUCKET[/PREFIX]'
            cand --s3-endpoint 'An S3-compatible endpoint (MinIO, R2, Ceph, SeaweedFS...) instead of AWS [env: AWS_ENDPOINT_URL_S3, AWS_ENDPOINT_URL]'
            cand --log-format 'Diagnostics as text lines or one JSON event per line'
            cand --json 'Print a JSON array instead of a table'
            cand -v 'More diagnostics on stderr: waiting, acquired, renewals, release'
            cand --verbose 'More diagnostics on stderr: waiting, acquired, renewals, release'
            cand -q 'No diagnostics at all'
            cand --quiet 'No diagnostics at all'
            cand -h 'Print help'
            cand --help 'Print help'
        }
        &'lockrun;release'= {
            cand --slot 'Only this slot (all of the name''s slots when omitted)'
            cand -b 'Where the lock lives (in any case: sqlite, SQLite)'
            cand --backend 'Where the lock lives (in any case: sqlite, SQLite)'
            cand --prefix 'Key prefix on redis (keys start with PREFIX:) and etcd (/PREFIX/); schema on postgres'
            cand --dir 'File backend''s directory [default: /run/lock/lockrun-$UID, else /var/tmp/lockrun-$UID; the same in every session]'
            cand --db 'SQLite database [default: $XDG_STATE_HOME/lockrun/locks.sqlite3, else ~/.local/state/lockrun/locks.sqlite3]'
            cand --redis-url 'Redis: redis://[user:pass@]host:port[/db], rediss:// (TLS), redis+unix:///path, redis+sentinel://[user:pass@]HOST:PORT[,HOST:PORT...]/PRIMARY[/db] or redis+cluster://[user:pass@]HOST:PORT[,HOST:PORT...]'
            cand --redis-replicas 'Replicas that must acknowledge an acquisition or renewal (WAIT) before it counts [default: 1 with redis+sentinel://, else 0]'
            cand --postgres-url 'PostgreSQL server: postgres://[user[:pass]@]host[:port]/db[?sslmode=...] or a key=value conninfo string [default: libpq''s: PGHOST, PGPORT, PGUSER, PGPASSWORD, PGDATABASE, the local socket]'
            cand --etcd-endpoints 'etcd v3 endpoints, comma-separated: http://[user:pass@]host:port, https:// for TLS'
            cand --s3-url 'The bucket and key prefix of the S3 backend: s3://BUCKET[/PREFIX]'
            cand --s3-endpoint 'An S3-compatible endpoint (MinIO, R2, Ceph, SeaweedFS...) instead of AWS [env: AWS_ENDPOINT_URL_S3, AWS_ENDPOINT_URL]'
            cand --log-format 'Diagnostics as text lines or one JSON event per line'
            cand --force 'Required: breaking a live holder''s lease lets a second holder in'
            cand -v 'More diagnostics on stderr: waiting, acquired, renewals, release'
            cand --verbose 'More diagnostics on stderr: waiting, acquired, renewals, release'
            cand -q 'No diagnostics at all'
            cand --quiet 'No diagnostics at all'
            cand -h 'Print help'
            cand --help 'Print help'
        }
        &'lockrun;check'= {
            cand -b 'Where the lock lives (in any case: sqlite, SQLite)'
            cand --backend 'Where the lock lives (in any case: sqlite, SQLite)'
            cand --prefix 'Key prefix on redis (keys start with PREFIX:) and etcd (/PREFIX/); schema on postgres'
            cand --dir 'File backend''s directory [default: /run/lock/lockrun-$UID, else /var/tmp/lockrun-$UID; the same in every session]'
            cand --db 'SQLite database [default: $XDG_STATE_HOME/lockrun/locks.sqlite3, else ~/.local/state/lockrun/locks.sqlite3]'
            cand --redis-url 'Redis: redis://[user:pass@]host:port[/db], rediss:// (TLS), redis+unix:///path, redis+sentinel://[user:pass@]HOST:PORT[,HOST:PORT...]/PRIMARY[/db] or redis+cluster://[user:pass@]HOST:PORT[,HOST:PORT...]'
            cand --redis-replicas 'Replicas that must acknowledge an acquisition or renewal (WAIT) before it counts [default: 1 with redis+sentinel://, else 0]'
            cand --postgres-url 'PostgreSQL server: postgres://[user[:pass]@]host[:port]/db[?sslmode=...] or a key=value conninfo string [default: libpq''s: PGHOST, PGPORT, PGUSER, PGPASSWORD, PGDATABASE, the local socket]'
            cand --etcd-endpoints 'etcd v3 endpoints, comma-separated: http://[user:pass@]host:port, https:// for TLS'
            cand --s3-url 'The bucket and key prefix of the S3 backend: s3://BUCKET[/PREFIX]'
            cand --s3-endpoint 'An S3-compatible endpoint (MinIO, R2, Ceph, SeaweedFS...) instead of AWS [env: AWS_ENDPOINT_URL_S3, AWS_ENDPOINT_URL]'
            cand --log-format 'Diagnostics as text lines or one JSON event per line'
            cand -v 'More diagnostics on stderr: waiting, acquired, renewals, release'
            cand --verbose 'More diagnostics on stderr: waiting, acquired, renewals, release'
            cand -q 'No diagnostics at all'
            cand --quiet 'No diagnostics at all'
            cand -h 'Print help'
            cand --help 'Print help'
        }
        &'lockrun;help'= {
            cand status 'List who holds a lock (every name when NAME is omitted)'
            cand release 'Break a lease that is known to be dead (every backend but file)'
            cand check 'Probe the store without taking a lock: reachable, and safe to lock on'
            cand help 'Print this message or the help of the given subcommand(s)'
        }
        &'lockrun;help;status'= {
        }
        &'lockrun;help;release'= {
        }
        &'lockrun;help;check'= {
        }
        &'lockrun;help;help'= {
        }
    ]
    $completions[$command]
}
