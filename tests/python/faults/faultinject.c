/* LD_PRELOAD fault injector for kvtier tests: fails (or shortens) chosen system calls on
 * paths that contain a substring, so faults hit block files and nothing else the process
 * (the Python interpreter) touches.
 *
 * Environment:
 *   KVTIER_FAULT        which call: open | open_direct | pwrite | pread | rename |
 *                       renameat2 | fdatasync | fsync | close | mkdir | openat2 |
 *                       slow_pwrite (close releases the descriptor and then reports the
 *                       error, as close(2) does for a deferred write error; pwrite covers pwrite/pwrite64/pwritev/pwritev64/pwritev2, pread the
 *                       read counterparts, rename covers rename/renameat/renameat2, mkdir
 *                       covers mkdir/mkdirat, open_direct only opens with O_DIRECT and, like
 *                       ramfs or a FUSE client, creates the file before failing an O_CREAT
 *                       open, openat2 fails the raw openat2 system call (made through
 *                       syscall()); open and open_direct also fail openat2 of a file,
 *                       slow_pwrite sleeps KVTIER_FAULT_DELAY_MS before each
 *                       matching write and then lets it through, unlink_created lets an
 *                       O_CREAT openat succeed and then removes the new name, as a sweep in
 *                       another PID namespace may before the writer locks its tmp file,
 *                       rename_created renames the new name to <name>.moved instead, as
 *                       NFS does when a file open on the host is unlinked)
 *   KVTIER_FAULT_MATCH  substring of the path (for descriptor calls: the path the descriptor
 *                       refers to; for *at calls: the directory's path joined with the
 *                       name); empty or unset matches every path
 *   KVTIER_FAULT_ERRNO  errno to inject (default EIO); 0 only logs the matching calls
 *   KVTIER_FAULT_SHORT  instead of failing pwrite/pread, transfer at most this many bytes
 *                       per call (a short write/read the caller must continue)
 *   KVTIER_FAULT_TIMES  inject at most this many times (default: every time)
 *   KVTIER_FAULT_AFTER  let this many matching calls through first, unlogged (default 0):
 *                       a fault in the third write of a block, not its first
 *   KVTIER_FAULT_GATE   a path: each injection first waits until it exists (with
 *                       KVTIER_FAULT_ERRNO=0 the call then proceeds), so a test can hold a
 *                       block operation in flight for as long as it needs
 *
 * Each injection writes one line "kvtier-fault: <call> <path>" to stderr, so a test can
 * check that the fault it asked for really fired.
 *
 * Build: cc -shared -fPIC -o faultinject.so faultinject.c -ldl
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/openat2.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <time.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#define MAX_IOV 1024

static const char* env_or(const char* name, const char* fallback) {
  const char* v = getenv(name);
  return v ? v : fallback;
}

static int fault_is(const char* call) { return strcmp(env_or("KVTIER_FAULT", ""), call) == 0; }

static int path_matches(const char* path) {
  const char* match = env_or("KVTIER_FAULT_MATCH", "");
  if (!*match) return 1;
  return path && strstr(path, match) != NULL;
}

static int fd_matches(int fd, char* path, size_t size) {
  char link[64];
  snprintf(link, sizeof(link), "/proc/self/fd/%d", fd);
  ssize_t n = readlink(link, path, size - 1);
  if (n < 0) n = 0;
  path[n] = '\0';
  return path_matches(path);
}

/* The path an *at call names: relative names are joined to the directory descriptor's path. */
static const char* at_path(int dirfd, const char* path, char* out, size_t size) {
  if (!path || path[0] == '/' || dirfd == AT_FDCWD) return path;
  char dir[4096];
  fd_matches(dirfd, dir, sizeof(dir));
  snprintf(out, size, "%s/%s", dir, path);
  return out;
}

static int fault_errno(void) { return atoi(env_or("KVTIER_FAULT_ERRNO", "5")); }

static long short_limit(void) { return atol(env_or("KVTIER_FAULT_SHORT", "0")); }

/* Claims one injection; 0 while KVTIER_FAULT_AFTER matching calls have not passed yet, once
 * KVTIER_FAULT_TIMES injections have been made, or when the call is only to be logged
 * (KVTIER_FAULT_ERRNO=0 without KVTIER_FAULT_SHORT). */
static int claim(const char* call, const char* path) {
  static long seen = 0;
  const char* after = getenv("KVTIER_FAULT_AFTER");
  if (after && *after && __atomic_add_fetch(&seen, 1, __ATOMIC_SEQ_CST) <= atol(after)) return 0;
  static long used = 0;
  const char* times = getenv("KVTIER_FAULT_TIMES");
  long n = __atomic_add_fetch(&used, 1, __ATOMIC_SEQ_CST);
  if (times && *times && n > atol(times)) return 0;
  char line[4352];
  int len = snprintf(line, sizeof(line), "kvtier-fault: %s %s\n", call, path ? path : "");
  if (len > 0) {
    ssize_t ignored = write(2, line, (size_t)len < sizeof(line) ? (size_t)len : sizeof(line) - 1);
    (void)ignored;
  }
  const char* gate = getenv("KVTIER_FAULT_GATE");
  const struct timespec tick = {0, 1000000};
  while (gate && *gate && access(gate, F_OK) != 0) nanosleep(&tick, NULL);
  return fault_errno() != 0 || short_limit() > 0;
}


#define REAL(name) ((real_##name##_t)dlsym(RTLD_NEXT, #name))

/* ---- open ------------------------------------------------------------------------------ */

typedef int (*real_open_t)(const char*, int, ...);
typedef int (*real_openat_t)(int, const char*, int, ...);

/* Returns 1 when the open must fail (errno set). An O_DIRECT create is failed the way the
 * kernel fails it on file systems without O_DIRECT: the file is created first. */
static int open_fault(int dirfd, const char* path, int flags, mode_t mode) {
  int hit = (fault_is("open") || (fault_is("open_direct") && (flags & O_DIRECT))) &&
            path_matches(path);
  if (hit && claim(fault_is("open") ? "open" : "open_direct", path)) {
    int err = fault_errno();
    if (fault_is("open_direct") && (flags & O_CREAT)) {
      int fd = ((real_openat_t)dlsym(RTLD_NEXT, "openat"))(dirfd, path, flags & ~O_DIRECT, mode);
      if (fd >= 0) close(fd);
    }
    errno = err;
    return 1;
  }
  return 0;
}

static mode_t mode_arg(int flags, va_list ap) {
  return (flags & O_CREAT) || (flags & O_TMPFILE) == O_TMPFILE ? (mode_t)va_arg(ap, int) : 0;
}

int open(const char* path, int flags, ...) {
  va_list ap;
  va_start(ap, flags);
  mode_t mode = mode_arg(flags, ap);
  va_end(ap);
  if (open_fault(AT_FDCWD, path, flags, mode)) return -1;
  return ((real_open_t)dlsym(RTLD_NEXT, "open"))(path, flags, mode);
}

int open64(const char* path, int flags, ...) {
  va_list ap;
  va_start(ap, flags);
  mode_t mode = mode_arg(flags, ap);
  va_end(ap);
  if (open_fault(AT_FDCWD, path, flags, mode)) return -1;
  return ((real_open_t)dlsym(RTLD_NEXT, "open64"))(path, flags, mode);
}

/* After a successful create: "unlink_created" removes the name it just made,
 * "rename_created" moves it to <name>.moved (the file stays linked). */
static int after_create(int fd, int dirfd, const char* path, const char* full, int flags) {
  if (fd < 0 || !(flags & O_CREAT) || !path_matches(full)) return fd;
  if (fault_is("unlink_created") && claim("unlink_created", full)) unlinkat(dirfd, path, 0);
  if (fault_is("rename_created") && claim("rename_created", full)) {
    char moved[8192];
    snprintf(moved, sizeof(moved), "%s.moved", path);
    int (*real_renameat)(int, const char*, int, const char*) =
        (int (*)(int, const char*, int, const char*))dlsym(RTLD_NEXT, "renameat");
    real_renameat(dirfd, path, dirfd, moved);
  }
  return fd;
}

int openat(int dirfd, const char* path, int flags, ...) {
  va_list ap;
  va_start(ap, flags);
  mode_t mode = mode_arg(flags, ap);
  va_end(ap);
  char full[8192];
  const char* named = at_path(dirfd, path, full, sizeof(full));
  if (open_fault(dirfd, named, flags, mode)) return -1;
  int fd = ((real_openat_t)dlsym(RTLD_NEXT, "openat"))(dirfd, path, flags, mode);
  return after_create(fd, dirfd, path, named, flags);
}

int openat64(int dirfd, const char* path, int flags, ...) {
  va_list ap;
  va_start(ap, flags);
  mode_t mode = mode_arg(flags, ap);
  va_end(ap);
  char full[8192];
  const char* named = at_path(dirfd, path, full, sizeof(full));
  if (open_fault(dirfd, named, flags, mode)) return -1;
  int fd = ((real_openat_t)dlsym(RTLD_NEXT, "openat64"))(dirfd, path, flags, mode);
  return after_create(fd, dirfd, path, named, flags);
}

/* ---- pwrite / pread -------------------------------------------------------------------- */

/* Returns 1 when the call must fail (errno set), else 0 with *limit set to the most bytes the
 * call may move (0: no limit). */
static int io_fault(const char* call, int fd, long* limit) {
  char path[4096];
  *limit = 0;
  if (fault_is("slow_pwrite") && strcmp(call, "pwrite") == 0 &&
      fd_matches(fd, path, sizeof(path))) {
    long ms = atol(env_or("KVTIER_FAULT_DELAY_MS", "100"));
    struct timespec delay = {ms / 1000, (ms % 1000) * 1000000L};
    while (nanosleep(&delay, &delay) != 0 && errno == EINTR) {
    }
    return 0;
  }
  if (!fault_is(call) || !fd_matches(fd, path, sizeof(path))) return 0;
  if (!claim(call, path)) return 0;
  long cap = short_limit();
  if (cap > 0) {
    *limit = cap;
    return 0;
  }
  errno = fault_errno();
  return 1;
}

/* Copies iov into out, trimmed to at most limit bytes; returns the new count. */
static int trim_iov(const struct iovec* iov, int count, long limit, struct iovec* out) {
  int n = 0;
  long left = limit;
  for (int i = 0; i < count && i < MAX_IOV && left > 0; ++i) {
    out[n] = iov[i];
    if ((long)out[n].iov_len > left) out[n].iov_len = (size_t)left;
    left -= (long)out[n].iov_len;
    ++n;
  }
  return n;
}

typedef ssize_t (*real_pwrite_t)(int, const void*, size_t, off_t);
typedef ssize_t (*real_pwrite64_t)(int, const void*, size_t, off_t);
typedef ssize_t (*real_pread_t)(int, void*, size_t, off_t);
typedef ssize_t (*real_pread64_t)(int, void*, size_t, off_t);
typedef ssize_t (*real_pwritev_t)(int, const struct iovec*, int, off_t);
typedef ssize_t (*real_pwritev64_t)(int, const struct iovec*, int, off_t);
typedef ssize_t (*real_preadv_t)(int, const struct iovec*, int, off_t);
typedef ssize_t (*real_preadv64_t)(int, const struct iovec*, int, off_t);
typedef ssize_t (*real_pwritev2_t)(int, const struct iovec*, int, off_t, int);
typedef ssize_t (*real_preadv2_t)(int, const struct iovec*, int, off_t, int);

#define PLAIN_IO(name, call, buftype)                                      \
  ssize_t name(int fd, buftype buf, size_t count, off_t offset) {          \
    long limit;                                                            \
    if (io_fault(call, fd, &limit)) return -1;                             \
    if (limit > 0 && (long)count > limit) count = (size_t)limit;           \
    return REAL(name)(fd, buf, count, offset);                             \
  }

PLAIN_IO(pwrite, "pwrite", const void*)
PLAIN_IO(pwrite64, "pwrite", const void*)
PLAIN_IO(pread, "pread", void*)
PLAIN_IO(pread64, "pread", void*)

#define VECTOR_IO(name, call)                                              \
  ssize_t name(int fd, const struct iovec* iov, int count, off_t offset) { \
    long limit;                                                            \
    struct iovec trimmed[MAX_IOV];                                         \
    if (io_fault(call, fd, &limit)) return -1;                             \
    if (limit > 0) {                                                       \
      count = trim_iov(iov, count, limit, trimmed);                        \
      iov = trimmed;                                                       \
    }                                                                      \
    return REAL(name)(fd, iov, count, offset);                             \
  }

VECTOR_IO(pwritev, "pwrite")
VECTOR_IO(pwritev64, "pwrite")
VECTOR_IO(preadv, "pread")
VECTOR_IO(preadv64, "pread")

#define VECTOR2_IO(name, call)                                                        \
  ssize_t name(int fd, const struct iovec* iov, int count, off_t offset, int flags) { \
    long limit;                                                                       \
    struct iovec trimmed[MAX_IOV];                                                    \
    if (io_fault(call, fd, &limit)) return -1;                                        \
    if (limit > 0) {                                                                  \
      count = trim_iov(iov, count, limit, trimmed);                                   \
      iov = trimmed;                                                                  \
    }                                                                                 \
    return REAL(name)(fd, iov, count, offset, flags);                                 \
  }

VECTOR2_IO(pwritev2, "pwrite")
VECTOR2_IO(preadv2, "pread")

/* ---- fdatasync / fsync ----------------------------------------------------------------- */

typedef int (*real_fdatasync_t)(int);
typedef int (*real_fsync_t)(int);

static int sync_fault(const char* call, int fd) {
  char path[4096];
  if (!fault_is(call) || !fd_matches(fd, path, sizeof(path)) || !claim(call, path)) return 0;
  errno = fault_errno();
  return 1;
}

int fdatasync(int fd) { return sync_fault("fdatasync", fd) ? -1 : REAL(fdatasync)(fd); }
int fsync(int fd) { return sync_fault("fsync", fd) ? -1 : REAL(fsync)(fd); }

/* ---- close ----------------------------------------------------------------------------- */

typedef int (*real_close_t)(int);

int close(int fd) {
  char path[4096];
  const int hit = fault_is("close") && fd_matches(fd, path, sizeof(path)) && claim("close", path);
  const int done = REAL(close)(fd);
  if (!hit) return done;
  errno = fault_errno();
  return -1;
}

/* ---- rename / mkdir -------------------------------------------------------------------- */

typedef int (*real_rename_t)(const char*, const char*);
typedef int (*real_renameat_t)(int, const char*, int, const char*);
typedef int (*real_renameat2_t)(int, const char*, int, const char*, unsigned int);
typedef int (*real_mkdir_t)(const char*, mode_t);

/* "rename" fails every rename call; "renameat2" only renameat2 (to exercise a fallback). */
static int rename_fault(const char* call, const char* from, const char* to) {
  int hit = fault_is("rename") || (fault_is("renameat2") && strcmp(call, "renameat2") == 0);
  if (!hit || !(path_matches(from) || path_matches(to)) || !claim(call, to)) return 0;
  errno = fault_errno();
  return 1;
}

int rename(const char* from, const char* to) {
  return rename_fault("rename", from, to) ? -1 : REAL(rename)(from, to);
}

int renameat(int fromfd, const char* from, int tofd, const char* to) {
  char a[8192], b[8192];
  if (rename_fault("renameat", at_path(fromfd, from, a, sizeof(a)),
                   at_path(tofd, to, b, sizeof(b))))
    return -1;
  return REAL(renameat)(fromfd, from, tofd, to);
}

int renameat2(int fromfd, const char* from, int tofd, const char* to, unsigned int flags) {
  char a[8192], b[8192];
  if (rename_fault("renameat2", at_path(fromfd, from, a, sizeof(a)),
                   at_path(tofd, to, b, sizeof(b))))
    return -1;
  return REAL(renameat2)(fromfd, from, tofd, to, flags);
}

static int mkdir_fault(const char* path) {
  if (fault_is("mkdir") && path_matches(path) && claim("mkdir", path)) {
    errno = fault_errno();
    return 1;
  }
  return 0;
}

int mkdir(const char* path, mode_t mode) {
  return mkdir_fault(path) ? -1 : REAL(mkdir)(path, mode);
}

typedef int (*real_mkdirat_t)(int, const char*, mode_t);

int mkdirat(int dirfd, const char* path, mode_t mode) {
  char full[8192];
  if (mkdir_fault(at_path(dirfd, path, full, sizeof(full)))) return -1;
  return REAL(mkdirat)(dirfd, path, mode);
}

/* ---- syscall(SYS_openat2, ...): no C library wraps it everywhere, so callers use syscall() */

typedef long (*real_syscall_t)(long, ...);

long syscall(long number, ...) {
  va_list ap;
  va_start(ap, number);
  long a[6];
  for (int i = 0; i < 6; ++i) a[i] = va_arg(ap, long);
  va_end(ap);
#ifdef SYS_openat2
  if (number == SYS_openat2) {
    char full[8192];
    const char* path = at_path((int)a[0], (const char*)a[1], full, sizeof(full));
    const struct open_how* how = (const struct open_how*)a[2];
    if (fault_is("openat2") && path_matches(path) && claim("openat2", path)) {
      errno = fault_errno();
      return -1;
    }
    /* A file opened in one openat2 meets the open faults as an openat would. */
    if (!(how->flags & O_DIRECTORY) &&
        open_fault((int)a[0], path, (int)how->flags, (mode_t)how->mode))
      return -1;
  }
#endif
  return REAL(syscall)(number, a[0], a[1], a[2], a[3], a[4], a[5]);
}
