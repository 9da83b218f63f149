
using namespace System.Management.Automation
using namespace System.Management.Automation.Language

Register-ArgumentCompleter -Native -CommandName 'lockrun' -ScriptBlock {
    param($wordToComplete, $commandAst, $cursorPosition)

    $commandElements = $commandAst.CommandElements
    $command = @(
        'lockrun'
        for ($i = 1; $i -lt $commandElements.Count; $i++) {
            $element = $commandElements[$i]
            if ($element -isnot [StringConstantExpressionAst] -or
                $element.StringConstantType -ne [StringConstantType]::BareWord -or
                $element.Value.StartsWith('-') -or
                $element.Value -eq $wordToComplete) {
                break
        }
        $element.Value
    }) -join ';'

    $completions = @(switch ($command) {
        'lockrun' {
            [CompletionResult]::new('--name', '--name', [CompletionResultType]::ParameterName, 'The lock''s name: 1 to 200 bytes, no control characters; several --name hold them all')
            [CompletionResult]::new('-b', '-b', [CompletionResultType]::ParameterName, 'Where the lock lives (in any case: sqlite, SQLite)')
            [CompletionResult]::new('--backend', '--backend', [CompletionResultType]::ParameterName, 'Where the lock lives (in any case: sqlite, SQLite)')
            [CompletionResult]::new('--prefix', '--prefix', [CompletionResultType]::ParameterName, 'Key prefix on redis (keys start with PREFIX:) and etcd (/PREFIX/); schema on postgres')
            [CompletionResult]::new('--dir', '--dir', [CompletionResultType]::ParameterName, 'File backend''s directory [default: /run/lock/lockrun-$UID, else /var/tmp/lockrun-$UID; the same in every session]')
            [CompletionResult]::new('--db', '--db', [CompletionResultType]::ParameterName, 'SQLite database [default: $XDG_STATE_HOME/lockrun/locks.sqlite3, else ~/.local/state/lockrun/locks.sqlite3]')
            [CompletionResult]::new('--redis-url', '--redis-url', [CompletionResultType]::ParameterName, 'Redis: redis://[user:pass@]host:port[/db], rediss:// (TLS), redis+unix:///path, redis+sentinel://[user:pass@]HOST:PORT[,HOST:PORT...]/PRIMARY[/db] or redis+cluster://[user:pass@]HOST:PORT[,HOST:PORT...]')
            [CompletionResult]::new('--redis-replicas', '--redis-replicas', [CompletionResultType]::ParameterName, 'Replicas that must acknowledge an acquisition or renewal (WAIT) before it counts [default: 1 with redis+sentinel://, else 0]')
            [CompletionResult]::new('--postgres-url', '--postgres-url', [CompletionResultType]::ParameterName, 'PostgreSQL server: postgres://[user[:pass]@]host[:port]/db[?sslmode=...] or a key=value conninfo string [default: libpq''s: PGHOST, PGPORT, PGUSER, PGPASSWORD, PGDATABASE, the local socket]')
            [CompletionResult]::new('--etcd-endpoints', '--etcd-endpoints', [CompletionResultType]::ParameterName, 'etcd v3 endpoints, comma-separated: http://[user:pass@]host:port, https:// for TLS')
            [CompletionResult]::new('--s3-url', '--s3-url', [CompletionResultType]::ParameterName, 'The bucket and key prefix of the S3 backend: s3://BUCKET[/PREFIX]')
            [CompletionResult]::new('--s3-endpoint', '--s3-endpoint', [CompletionResultType]::ParameterName, 'An S3-compatible endpoint (MinIO, R2, Ceph, SeaweedFS...) instead of AWS [env: AWS_ENDPOINT_URL_S3, AWS_ENDPOINT_URL]')
            [CompletionResult]::new('-p', '-p', [CompletionResultType]::ParameterName, 'How many holders at once (slots), 1 to 1024; the same for every run of a name while it is held or waited for')
            [CompletionResult]::new('--parallelism', '--parallelism', [CompletionResultType]::ParameterName, 'How many holders at once (slots), 1 to 1024; the same for every run of a name while it is held or waited for')
            [CompletionResult]::new('-w', '-w', [CompletionResultType]::ParameterName, 'Longest wait for a slot; inf waits forever')
            [CompletionResult]::new('--timeout', '--timeout', [CompletionResultType]::ParameterName, 'Longest wait for a slot; inf waits forever')
            [CompletionResult]::new('--initial-delay', '--initial-delay', [CompletionResultType]::ParameterName, 'First retry delay when polling')
            [CompletionResult]::new('--max-delay', '--max-delay', [CompletionResultType]::ParameterName, 'Cap on the retry delay')
            [CompletionResult]::new('--backoff-multiplier', '--backoff-multiplier', [CompletionResultType]::ParameterName, 'Growth of the retry delay per retry (>= 1)')
            [CompletionResult]::new('--ttl', '--ttl', [CompletionResultType]::ParameterName, 'Lease length on every backend but file; renewed every TTL/3 while the command runs')
            [CompletionResult]::new('--min-hold', '--min-hold', [CompletionResultType]::ParameterName, 'Keep the slot taken at least this long after acquiring')
            [CompletionResult]::new('--max-runtime', '--max-runtime', [CompletionResultType]::ParameterName, 'Stop the command after this long (exit 124); 0 means no limit')
            [CompletionResult]::new('--kill-grace', '--kill-grace', [CompletionResultType]::ParameterName, 'Time between SIGTERM and SIGKILL when lockrun stops the command [default: 10s, at most TTL/3 on every backend but file]')
            [CompletionResult]::new('-E', '-E ', [CompletionResultType]::ParameterName, 'Exit status when no slot was acquired, 0 to 255')
            [CompletionResult]::new('--conflict-exit-code', '--conflict-exit-code', [CompletionResultType]::ParameterName, 'Exit status when no slot was acquired, 0 to 255')
            [CompletionResult]::new('-c', '-c', [CompletionResultType]::ParameterName, 'Run this string with /bin/sh -c instead of COMMAND ARGS')
            [CompletionResult]::new('--command', '--command', [CompletionResultType]::ParameterName, 'Run this string with /bin/sh -c instead of COMMAND ARGS')
            [CompletionResult]::new('--note', '--note', [CompletionResultType]::ParameterName, 'What status and the events say about this run, beside its program''s name, pid, host and user')
            [CompletionResult]::new('--log-format', '--log-format', [CompletionResultType]::ParameterName, 'Diagnostics as text lines or one JSON event per line')
            [CompletionResult]::new('-s', '-s', [CompletionResultType]::ParameterName, 'Hold the name in shared mode: shared holders hold it together, an exclusive holder alone; only with -p 1')
            [CompletionResult]::new('--shared', '--shared', [CompletionResultType]::ParameterName, 'Hold the name in shared mode: shared holders hold it together, an exclusive holder alone; only with -p 1')
            [CompletionResult]::new('-x', '-x', [CompletionResultType]::ParameterName, 'The default mode, a holder alone: accepted so that lines ported from flock(1) (-x, -e) run unchanged; not with -s')
            [CompletionResult]::new('--exclusive', '--exclusive', [CompletionResultType]::ParameterName, 'The default mode, a holder alone: accepted so that lines ported from flock(1) (-x, -e) run unchanged; not with -s')
            [CompletionResult]::new('-n', '-n', [CompletionResultType]::ParameterName, 'Give up at once if no slot is free (same as --timeout 0); trouble with the store is ridden out for 10 s')
            [CompletionResult]::new('--no-wait', '--no-wait', [CompletionResultType]::ParameterName, 'Give up at once if no slot is free (same as --timeout 0); trouble with the store is ridden out for 10 s')
            [CompletionResult]::new('--record-command', '--record-command', [CompletionResultType]::ParameterName, 'Record the whole command line in the store for status, not only the program''s name')
            [CompletionResult]::new('-v', '-v', [CompletionResultType]::ParameterName, 'More diagnostics on stderr: waiting, acquired, renewals, release')
            [CompletionResult]::new('--verbose', '--verbose', [CompletionResultType]::ParameterName, 'More diagnostics on stderr: waiting, acquired, renewals, release')
            [CompletionResult]::new('-q', '-q', [CompletionResultType]::ParameterName, 'No diagnostics at all')
            [CompletionResult]::new('--quiet', '--quiet', [CompletionResultType]::ParameterName, 'No diagnostics at all')
            [CompletionResult]::new('-h', '-h', [CompletionResultType]::ParameterName, 'Print help')
            [CompletionResult]::new('--help', '--help', [CompletionResultType]::ParameterName, 'Print help')
            [CompletionResult]::new('-V', '-V ', [CompletionResultType]::ParameterName, 'Print version')
            [CompletionResult]::new('--version', '--version', [CompletionResultType]::ParameterName, 'Print version')
            [CompletionResult]::new('status', 'status', [CompletionResultType]::ParameterValue, 'List who holds a lock (every name when NAME is omitted)')
            [CompletionResult]::new('release', 'release', [CompletionResultType]::ParameterValue, 'Break a lease that is known to be dead (every backend but file)')
            [CompletionResult]::new('check', 'check', [CompletionResultType]::ParameterValue, 'Probe the store without taking a lock: reachable, and safe to lock on')
            [CompletionResult]::new('help', 'help', [CompletionResultType]::ParameterValue, 'Print this message or the help of the given subcommand(s)')
            break
        }
        'lockrun;status' {
            [CompletionResult]::new('-b', '-b', [CompletionResultType]::ParameterName, 'Where the lock lives (in any case: sqlite, SQLite)')
            [CompletionResult]::new('--backend', '--backend', [CompletionResultType]::ParameterName, 'Where the lock lives (in any case: sqlite, SQLite)')
            [CompletionResult]::new('--prefix', '--prefix', [CompletionResultType]::ParameterName, 'Key prefix on redis (keys start with PREFIX:) and etcd (/PREFIX/); schema on postgres')
            [CompletionResult]::new('--dir', '--dir', [CompletionResultType]::ParameterName, 'File backend''s directory [default: /run/lock/lockrun-$UID, else /var/tmp/lockrun-$UID; the same in every session]')
            [CompletionResult]::new('--db', '--db', [CompletionResultType]::ParameterName, 'SQLite database [default: $XDG_STATE_HOME/lockrun/locks.sqlite3, else ~/.local/state/lockrun/locks.sqlite3]')
            [CompletionResult]::new('--redis-url', '--redis-url', [CompletionResultType]::ParameterName, 'Redis: redis://[user:pass@]host:port[/db], rediss:// (TLS), redis+unix:///path, redis+sentinel://[user:pass@]HOST:PORT[,HOST:PORT...]/PRIMARY[/db] or redis+cluster://[user:pass@]HOST:PORT[,HOST:PORT...]')
            [CompletionResult]::new('--redis-replicas', '--redis-replicas', [CompletionResultType]::ParameterName, 'Replicas that must acknowledge an acquisition or renewal (WAIT) before it counts [default: 1 with redis+sentinel://, else 0]')
            [CompletionResult]::new('--postgres-url', '--postgres-url', [CompletionResultType]::ParameterName, 'PostgreSQL server: postgres://[user[:pass]@]host[:port]/db[?sslmode=...] or a key=value conninfo string [default: libpq''s: PGHOST, PGPORT, PGUSER, PGPASSWORD, PGDATABASE, the local socket]')
            [CompletionResult]::new('--etcd-endpoints', '--etcd-endpoints', [CompletionResultType]::ParameterName, 'etcd v3 endpoints, comma-separated: http://[user:pass@]host:port, https:// for TLS')
            [CompletionResult]::new('--s3-url', '--s3-url', [CompletionResultType]::ParameterName, 'The bucket and key prefix of the S3 backend: s3://BUCKET[/PREFIX]')
            [CompletionResult]::new('--s3-endpoint', '--s3-endpoint', [CompletionResultType]::ParameterName, 'An S3-compatible endpoint (MinIO, R2, Ceph, SeaweedFS...) instead of AWS [env: AWS_ENDPOINT_URL_S3, AWS_ENDPOINT_URL]')
            [CompletionResult]::new('--log-format', '--log-format', [CompletionResultType]::ParameterName, 'Diagnostics as text lines or one JSON event per line')
            [CompletionResult]::new('--json', '--json', [CompletionResultType]::ParameterName, 'Print a JSON array instead of a table')
            [CompletionResult]::new('-v', '-v', [CompletionResultType]::ParameterName, 'More diagnostics on stderr: waiting, acquired, renewals, release')
            [CompletionResult]::new('--verbose', '--verbose', [CompletionResultType]::ParameterName, 'More diagnostics on stderr: waiting, acquired, renewals, release')
            [CompletionResult]::new('-q', '-q', [CompletionResultType]::ParameterName, 'No diagnostics at all')
            [CompletionResult]::new('--quiet', '--quiet', [CompletionResultType]::ParameterName, 'No diagnostics at all')
            [CompletionResult]::new('-h', '-h', [CompletionResultType]::ParameterName, 'Print help')
            [CompletionResult]::new('--help', '--help', [CompletionResultType]::ParameterName, 'Print help')
            break
        }
        'lockrun;release' {
            [CompletionResult]::new('--slot', '--slot', [CompletionResultType]::ParameterName, 'Only this slot (all of the name''s slots when omitted)')
            [CompletionResult]::new('-b', '-b', [CompletionResultType]::ParameterName, 'Where the lock lives (in any case: sqlite, SQLite)')
            [CompletionResult]::new('--backend', '--backend', [CompletionResultType]::ParameterName, 'Where the lock lives (in any case: sqlite, SQLite)')
            [CompletionResult]::new('--prefix', '--prefix', [CompletionResultType]::ParameterName, 'Key prefix on redis (keys start with PREFIX:) and etcd (/PREFIX/); schema on postgres')
            [CompletionResult]::new('--dir', '--dir', [CompletionResultType]::ParameterName, 'File backend''s directory [default: /run/lock/lockrun-$UID, else /var/tmp/lockrun-$UID; the same in every session]')
            [CompletionResult]::new('--db', '--db', [CompletionResultType]::ParameterName, 'SQLite database [default: $XDG_STATE_HOME/lockrun/locks.sqlite3, else ~/.local/state/lockrun/locks.sqlite3]')
            [CompletionResult]::new('--redis-url', '--redis-url', [CompletionResultType]::ParameterName, 'Redis: redis://[user:pass@]host:port[/db], rediss:// (TLS), redis+unix:///path, redis+sentinel://[user:pass@]HOST:PORT[,HOST:PORT...]/PRIMARY[/db] or redis+cluster://[user:pass@]HOST:PORT[,HOST:PORT...]')
            [CompletionResult]::new('--redis-replicas', '--redis-replicas', [CompletionResultType]::ParameterName, 'Replicas that must acknowledge an acquisition or renewal (WAIT) before it counts [default: 1 with redis+sentinel://, else 0]')
            [CompletionResult]::new('--postgres-url', '--postgres-url', [CompletionResultType]::ParameterName, 'PostgreSQL server: postgres://[user[:pass]@]host[:port]/db[?sslmode=...] or a key=value conninfo string [default: libpq''s: PGHOST, PGPORT, PGUSER, PGPASSWORD, PGDATABASE, the local socket]')
            [CompletionResult]::new('--etcd-endpoints', '--etcd-endpoints', [CompletionResultType]::ParameterName, 'etcd v3 endpoints, comma-separated: http://[user:pass@]host:port, https:// for TLS')
            [CompletionResult]::new('--s3-url', '--s3-url', [CompletionResultType]::ParameterName, 'The bucket and key prefix of the S3 backend: s3://BUCKET[/PREFIX]')
            [CompletionResult]::new('--s3-endpoint', '--s3-endpoint', [CompletionResultType]::ParameterName, 'An S3-compatible endpoint (MinIO, R2, Ceph, SeaweedFS...) instead of AWS [env: AWS_ENDPOINT_URL_S3, AWS_ENDPOINT_URL]')
            [CompletionResult]::new('--log-format', '--log-format', [CompletionResultType]::ParameterName, 'Diagnostics as text lines or one JSON event per line')
            [CompletionResult]::new('--force', '--force', [CompletionResultType]::ParameterName, 'Required: breaking a live holder''s lease lets a second holder in')
            [CompletionResult]::new('-v', '-v', [CompletionResultType]::ParameterName, 'More diagnostics on stderr: waiting, acquired, renewals, release')
            [CompletionResult]::new('--verbose', '--verbose', [CompletionResultType]::ParameterName, 'More diagnostics on stderr: waiting, acquired, renewals, release')
            [CompletionResult]::new('-q', '-q', [CompletionResultType]::ParameterName, 'No diagnostics at all')
            [CompletionResult]::new('--quiet', '--quiet', [CompletionResultType]::ParameterName, 'No diagnostics at all')
            [CompletionResult]::new('-h', '-h', [CompletionResultType]::ParameterName, 'Print help')
            [CompletionResult]::new('--help', '--help', [CompletionResultType]::ParameterName, 'Print help')
            break
        }
        'lockrun;check' {
            [CompletionResult]::new('-b', '-b', [CompletionResultType]::ParameterName, 'Where the lock lives (in any case: sqlite, SQLite)')
            [CompletionResult]::new('--backend', '--backend', [CompletionResultType]::ParameterName, 'Where the lock lives (in any case: sqlite, SQLite)')
            [CompletionResult]::new('--prefix', '--prefix', [CompletionResultType]::ParameterName, 'Key prefix on redis (keys start with PREFIX:) and etcd (/PREFIX/); schema on postgres')
            [CompletionResult]::new('--dir', '--dir', [CompletionResultType]::ParameterName, 'File backend''s directory [default: /run/lock/lockrun-$UID, else /var/tmp/lockrun-$UID; the same in every session]')
            [CompletionResult]::new('--db', '--db', [CompletionResultType]::ParameterName, 'SQLite database [default: $XDG_STATE_HOME/lockrun/locks.sqlite3, else ~/.local/state/lockrun/locks.sqlite3]')
            [CompletionResult]::new('--redis-url', '--redis-url', [CompletionResultType]::ParameterName, 'Redis: redis://[user:pass@]host:port[/db], rediss:// (TLS), redis+unix:///path, redis+sentinel://[user:pass@]HOST:PORT[,HOST:PORT...]/PRIMARY[/db] or redis+cluster://[user:pass@]HOST:PORT[,HOST:PORT...]')
            [CompletionResult]::new('--redis-replicas', '--redis-replicas', [CompletionResultType]::ParameterName, 'Replicas that must acknowledge an acquisition or renewal (WAIT) before it counts [default: 1 with redis+sentinel://, else 0]')
            [CompletionResult]::new('--postgres-url', '--postgres-url', [CompletionResultType]::ParameterName, 'PostgreSQL server: postgres://[user[:pass]@]host[:port]/db[?sslmode=...] or a key=value conninfo string [default: libpq''s: PGHOST, PGPORT, PGUSER, PGPASSWORD, PGDATABASE, the local socket]')
            [CompletionResult]::new('--etcd-endpoints', '--etcd-endpoints', [CompletionResultType]::ParameterName, 'etcd v3 endpoints, comma-separated: http://[user:pass@]host:port, https:// for TLS')
            [CompletionResult]::new('--s3-url', '--s3-url', [CompletionResultType]::ParameterName, 'The bucket and key prefix of the S3 backend: s3://BUCKET[/PREFIX]')
            [CompletionResult]::new('--s3-endpoint', '--s3-endpoint', [CompletionResultType]::ParameterName, 'An S3-compatible endpoint (MinIO, R2, Ceph, SeaweedFS...) instead of AWS [env: AWS_ENDPOINT_URL_S3, AWS_ENDPOINT_URL]')
            [CompletionResult]::new('--log-format', '--log-format', [CompletionResultType]::ParameterName, 'Diagnostics as text lines or one JSON event per line')
            [CompletionResult]::new('-v', '-v', [CompletionResultType]::ParameterName, 'More diagnostics on stderr: waiting, acquired, renewals, release')
            [CompletionResult]::new('--verbose', '--verbose', [CompletionResultType]::ParameterName, 'More diagnostics on stderr: waiting, acquired, renewals, release')
            [CompletionResult]::new('-q', '-q', [CompletionResultType]::ParameterName, 'No diagnostics at all')
            [CompletionResult]::new('--quiet', '--quiet', [CompletionResultType]::ParameterName, 'No diagnostics at all')
            [CompletionResult]::new('-h', '-h', [CompletionResultType]::ParameterName, 'Print help')
            [CompletionResult]::new('--help', '--help', [CompletionResultType]::ParameterName, 'Print help')
            break
        }
        'lockrun;help' {
            [CompletionResult]::new('status', 'status', [CompletionResultType]::ParameterValue, 'List who holds a lock (every name when NAME is omitted)')
            [CompletionResult]::new('release', 'release', [CompletionResultType]::ParameterValue, 'Break a lease that is known to be dead (every backend but file)')
            [CompletionResult]::new('check', 'check', [CompletionResultType]::ParameterValue, 'Probe the store without taking a lock: reachable, and safe to lock on')
            [CompletionResult]::new('help', 'help', [CompletionResultType]::ParameterValue, 'Print this message or the help of the given subcommand(s)')
            break
        }
        'lockrun;help;status' {
            break
        }
        'lockrun;help;release' {
            break
        }
        'lockrun;help;check' {
            break
        }
        'lockrun;help;help' {
            break
        }
    })

    $completions.Where{ $_.CompletionText -like "$wordToComplete*" } |
        Sort-Object -Property ListItemText
}
