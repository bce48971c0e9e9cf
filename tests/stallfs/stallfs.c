/* stallfs: a FUSE passthrough of a backing directory whose operations a test can freeze,
 * fail or slow down, so that storage stalls are real: a frozen operation sits in the kernel's
 * FUSE request wait, as it does on a hung FUSE daemon, NFS server or disk.
 *
 * Usage: stallfs --backing DIR --control SOCKET [--direct-io] [-o OPTIONS] MOUNTPOINT
 *   Runs in the foreground until unmounted (or SIGTERM). The control socket is created once
 *   the kernel has sent FUSE_INIT, so a control connection that answers "ok" to "ping" means
 *   the mount is live. --direct-io makes every open FOPEN_DIRECT_IO (no page cache on the FUSE
 *   side: every read and write reaches this daemon, even without O_DIRECT). -o takes the
 *   usual FUSE mount options (allow_other, fsname=..., subtype=...).
 *
 * Control protocol (a Unix stream socket; one command a line, one reply line each):
 *   ping                     -> ok
 *   freeze CLASS             operations of CLASS block until thawed (a real block)
 *   thaw                     wakes every blocked operation and stops freezing
 *   fail ERRNO [CLASS]       operations of CLASS fail with ERRNO (0 stops failing)
 *   delay MS [CLASS]         operations of CLASS first sleep MS milliseconds (0 stops)
 *   match [SUBSTRING]        faults hit only backing paths containing SUBSTRING (none: all)
 *   reset                    thaw, no failure, no delay, no match
 *   status                   -> ok frozen=CLASS fail=ERRNO:CLASS delay=MS:CLASS blocked=N
 *                               active=N ops=N match=SUBSTRING
 *                            (blocked: frozen right now; active: in a handler right now,
 *                            frozen or not; ops: seen since the start)
 *   CLASS is data (read, write, flush, fsync, fallocate), meta (everything else a caller
 *   waits for: lookup, getattr, setattr, open, create, rename, unlink, mkdir, readdir,
 *   statfs, ...) or all; the default is all. Forget and release are never held (callers do
 *   not wait for them). Errors answer "err <why>".
 *
 * It is written on libfuse's low-level (inode) API: the high-level (path) API holds a lock
 * per path while an operation runs, so a frozen read of a file would also block a rename or
 * unlink of it, even with metadata not frozen. Here a frozen operation blocks only itself.
 *
 * What the kernel keeps to itself: POSIX, OFD and flock locks (no lock operations are
 * implemented, so the kernel's local lock code handles them on the FUSE inode; they exclude
 * between processes using this mount and never reach the daemon, so they never freeze).
 * Entry and attribute timeouts are 0 and the writeback cache is off, so every lookup, stat
 * and write(2) reaches the daemon. O_DIRECT opens are accepted by the kernel (it then
 * bypasses the page cache for that file); the daemon drops O_DIRECT when it opens the
 * backing file, since its request buffers are not aligned.
 */
#define FUSE_USE_VERSION 312
#define _GNU_SOURCE

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <fuse_lowlevel.h>
#include <limits.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

enum { kData = 1, kMeta = 2, kAll = kData | kMeta };

/* ---- faults ------------------------------------------------------------------------------ */

struct faults {
  int frozen;     /* classes that block */
  int fail_errno; /* 0: none */
  int fail_classes;
  long delay_ms;
  int delay_classes;
  char match[PATH_MAX];
};

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_thawed = PTHREAD_COND_INITIALIZER;
static struct faults g_faults;
static long g_blocked; /* operations parked in a freeze right now */
static long g_ops;     /* operations that passed through gate() */
static long g_active;  /* operations between gate() and their reply (frozen ones included) */

static struct fuse_session* g_se;
static const char* g_control_path;
static int g_control_fd = -1;
static int g_direct_io;

/* ---- inodes ------------------------------------------------------------------------------ */

/* One backing object the kernel knows: an O_PATH descriptor, found again by (dev, ino). */
struct inode {
  int fd;
  dev_t dev;
  ino_t ino;
  uint64_t nlookup; /* the kernel's references (lookups not yet forgotten) */
  struct inode* next;
};

enum { kBuckets = 4096 };
static struct inode g_root;
static struct inode* g_table[kBuckets];
static pthread_mutex_t g_table_lock = PTHREAD_MUTEX_INITIALIZER;

static struct inode* inode_of(fuse_ino_t ino) {
  return ino == FUSE_ROOT_ID ? &g_root : (struct inode*)(uintptr_t)ino;
}

static size_t bucket(dev_t dev, ino_t ino) {
  return (size_t)((ino * 0x9E3779B97F4A7C15ULL) ^ dev) % kBuckets;
}

/* The backing path of `in` (plus "/name"), for `match`; "" where it cannot be read. */
static void path_of(struct inode* in, const char* name, char* out, size_t size) {
  char link[64];
  snprintf(link, sizeof(link), "/proc/self/fd/%d", in->fd);
  ssize_t n = readlink(link, out, size - 1);
  if (n < 0) n = 0;
  out[n] = '\0';
  if (name) snprintf(out + n, size - (size_t)n, "/%s", name);
}

/* ---- the gate every held operation passes ------------------------------------------------ */

static int matches(struct inode* in, const char* name) {
  if (g_faults.match[0] == '\0') return 1;
  char path[PATH_MAX];
  path_of(in, name, path, sizeof(path));
  return strstr(path, g_faults.match) != NULL;
}

static void unlock_blocked(void* unused) {
  (void)unused;
  --g_blocked;
  pthread_mutex_unlock(&g_lock);
}

/* Blocks while the operation's class is frozen, then sleeps the delay, then fails with the
 * chosen errno. Returns 0 or an errno to reply with. */
static int gate(int cls, struct inode* in, const char* name) {
  pthread_mutex_lock(&g_lock);
  ++g_ops;
  if ((g_faults.frozen & cls) && matches(in, name)) {
    ++g_blocked;
    pthread_cleanup_push(unlock_blocked, NULL);
    while ((g_faults.frozen & cls) && matches(in, name)) {
      /* Wakes now and then to notice an unmount or SIGTERM: a session that is ending must
       * not wait for a thaw that will never come. */
      struct timespec until;
      clock_gettime(CLOCK_REALTIME, &until);
      until.tv_nsec += 200 * 1000 * 1000;
      if (until.tv_nsec >= 1000000000L) {
        until.tv_sec += 1;
        until.tv_nsec -= 1000000000L;
      }
      pthread_cond_timedwait(&g_thawed, &g_lock, &until);
      if (fuse_session_exited(g_se)) break;
    }
    pthread_cleanup_pop(0);
    --g_blocked;
    if (fuse_session_exited(g_se)) {
      pthread_mutex_unlock(&g_lock);
      return EIO;
    }
  }
  int hit = (g_faults.delay_classes & cls) || (g_faults.fail_classes & cls);
  hit = hit && matches(in, name);
  long delay = hit && (g_faults.delay_classes & cls) ? g_faults.delay_ms : 0;
  int err = hit && (g_faults.fail_classes & cls) ? g_faults.fail_errno : 0;
  pthread_mutex_unlock(&g_lock);
  if (delay > 0) {
    struct timespec d = {delay / 1000, (delay % 1000) * 1000000L};
    while (nanosleep(&d, &d) != 0 && errno == EINTR) {
    }
  }
  return err;
}

static int enter(void) {
  return __atomic_add_fetch(&g_active, 1, __ATOMIC_SEQ_CST) > 0;
}

static void leave(int* entered) {
  if (*entered) __atomic_sub_fetch(&g_active, 1, __ATOMIC_SEQ_CST);
}

/* Opens a held operation: counts it active until its handler returns (the cleanup runs at
 * whichever return), and replies with the injected errno when the gate says so. */
#define GATE(req, cls, in, name)                               \
  int gate_entered_ __attribute__((cleanup(leave))) = enter(); \
  (void)gate_entered_;                                         \
  do {                                                         \
    int gate_ = gate(cls, in, name);                           \
    if (gate_) {                                               \
      fuse_reply_err(req, gate_);                              \
      return;                                                  \
    }                                                          \
  } while (0)

/* ---- lookups and inode lifetime ---------------------------------------------------------- */

/* Looks `name` up beneath `parent` and fills `e` (a new kernel reference). Returns 0 or errno. */
static int do_lookup(struct inode* parent, const char* name, struct fuse_entry_param* e) {
  memset(e, 0, sizeof(*e));
  int fd = openat(parent->fd, name, O_PATH | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return errno;
  if (fstatat(fd, "", &e->attr, AT_EMPTY_PATH | AT_SYMLINK_NOFOLLOW) != 0) {
    int err = errno;
    close(fd);
    return err;
  }
  pthread_mutex_lock(&g_table_lock);
  size_t b = bucket(e->attr.st_dev, e->attr.st_ino);
  struct inode* in = g_table[b];
  while (in && (in->dev != e->attr.st_dev || in->ino != e->attr.st_ino)) in = in->next;
  if (in) {
    close(fd);
  } else {
    in = calloc(1, sizeof(*in));
    if (!in) {
      pthread_mutex_unlock(&g_table_lock);
      close(fd);
      return ENOMEM;
    }
    in->fd = fd;
    in->dev = e->attr.st_dev;
    in->ino = e->attr.st_ino;
    in->next = g_table[b];
    g_table[b] = in;
  }
  ++in->nlookup;
  pthread_mutex_unlock(&g_table_lock);
  e->ino = (fuse_ino_t)(uintptr_t)in;
  e->attr_timeout = 0;
  e->entry_timeout = 0;
  return 0;
}

static void forget_one(fuse_ino_t ino, uint64_t n) {
  struct inode* in = inode_of(ino);
  if (in == &g_root) return;
  pthread_mutex_lock(&g_table_lock);
  in->nlookup -= n < in->nlookup ? n : in->nlookup;
  if (in->nlookup == 0) {
    struct inode** link = &g_table[bucket(in->dev, in->ino)];
    while (*link != in) link = &(*link)->next;
    *link = in->next;
    close(in->fd);
    free(in);
  }
  pthread_mutex_unlock(&g_table_lock);
}

static void sfs_forget(fuse_req_t req, fuse_ino_t ino, uint64_t n) {
  forget_one(ino, n);
  fuse_reply_none(req);
}

static void sfs_forget_multi(fuse_req_t req, size_t count, struct fuse_forget_data* forgets) {
  for (size_t i = 0; i < count; ++i) forget_one(forgets[i].ino, forgets[i].nlookup);
  fuse_reply_none(req);
}

static void reply_entry(fuse_req_t req, struct inode* parent, const char* name) {
  struct fuse_entry_param e;
  int err = do_lookup(parent, name, &e);
  if (err)
    fuse_reply_err(req, err);
  else if (fuse_reply_entry(req, &e) != 0)
    forget_one(e.ino, 1); /* the kernel never got the reference */
}

static void sfs_lookup(fuse_req_t req, fuse_ino_t parent, const char* name) {
  GATE(req, kMeta, inode_of(parent), name);
  reply_entry(req, inode_of(parent), name);
}

/* ---- attributes -------------------------------------------------------------------------- */

/* A path that names the object itself, for calls that take no O_PATH descriptor. */
static void proc_path(struct inode* in, char* out, size_t size) {
  snprintf(out, size, "/proc/self/fd/%d", in->fd);
}

static void sfs_getattr(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info* fi) {
  struct inode* in = inode_of(ino);
  GATE(req, kMeta, in, NULL);
  struct stat st;
  int r =
      fi ? fstat((int)fi->fh, &st) : fstatat(in->fd, "", &st, AT_EMPTY_PATH | AT_SYMLINK_NOFOLLOW);
  if (r != 0)
    fuse_reply_err(req, errno);
  else
    fuse_reply_attr(req, &st, 0);
}

static void sfs_setattr(fuse_req_t req, fuse_ino_t ino, struct stat* attr, int to_set,
                        struct fuse_file_info* fi) {
  struct inode* in = inode_of(ino);
  GATE(req, kMeta, in, NULL);
  char path[64];
  proc_path(in, path, sizeof(path));
  int r = 0;
  if (to_set & FUSE_SET_ATTR_MODE)
    r = fi ? fchmod((int)fi->fh, attr->st_mode) : chmod(path, attr->st_mode);
  if (r == 0 && (to_set & (FUSE_SET_ATTR_UID | FUSE_SET_ATTR_GID))) {
    uid_t uid = (to_set & FUSE_SET_ATTR_UID) ? attr->st_uid : (uid_t)-1;
    gid_t gid = (to_set & FUSE_SET_ATTR_GID) ? attr->st_gid : (gid_t)-1;
    r = fchownat(in->fd, "", uid, gid, AT_EMPTY_PATH | AT_SYMLINK_NOFOLLOW);
  }
  if (r == 0 && (to_set & FUSE_SET_ATTR_SIZE))
    r = fi ? ftruncate((int)fi->fh, attr->st_size) : truncate(path, attr->st_size);
  if (r == 0 && (to_set & (FUSE_SET_ATTR_ATIME | FUSE_SET_ATTR_MTIME))) {
    struct timespec tv[2] = {{0, UTIME_OMIT}, {0, UTIME_OMIT}};
    if (to_set & FUSE_SET_ATTR_ATIME_NOW)
      tv[0].tv_nsec = UTIME_NOW;
    else if (to_set & FUSE_SET_ATTR_ATIME)
      tv[0] = attr->st_atim;
    if (to_set & FUSE_SET_ATTR_MTIME_NOW)
      tv[1].tv_nsec = UTIME_NOW;
    else if (to_set & FUSE_SET_ATTR_MTIME)
      tv[1] = attr->st_mtim;
    r = fi ? futimens((int)fi->fh, tv) : utimensat(AT_FDCWD, path, tv, 0);
  }
  if (r != 0) {
    fuse_reply_err(req, errno);
    return;
  }
  struct stat st;
  if (fstatat(in->fd, "", &st, AT_EMPTY_PATH | AT_SYMLINK_NOFOLLOW) != 0)
    fuse_reply_err(req, errno);
  else
    fuse_reply_attr(req, &st, 0);
}

static void sfs_readlink(fuse_req_t req, fuse_ino_t ino) {
  struct inode* in = inode_of(ino);
  GATE(req, kMeta, in, NULL);
  char buf[PATH_MAX + 1];
  ssize_t n = readlinkat(in->fd, "", buf, sizeof(buf) - 1);
  if (n < 0) {
    fuse_reply_err(req, errno);
    return;
  }
  buf[n] = '\0';
  fuse_reply_readlink(req, buf);
}

static void sfs_access(fuse_req_t req, fuse_ino_t ino, int mask) {
  struct inode* in = inode_of(ino);
  GATE(req, kMeta, in, NULL);
  char path[64];
  proc_path(in, path, sizeof(path));
  fuse_reply_err(req, faccessat(AT_FDCWD, path, mask, 0) == 0 ? 0 : errno);
}

static void sfs_statfs(fuse_req_t req, fuse_ino_t ino) {
  struct inode* in = inode_of(ino);
  GATE(req, kMeta, in, NULL);
  struct statvfs st;
  if (fstatvfs(in->fd, &st) != 0)
    fuse_reply_err(req, errno);
  else
    fuse_reply_statfs(req, &st);
}

/* ---- names ------------------------------------------------------------------------------- */

static void sfs_mknod(fuse_req_t req, fuse_ino_t parent, const char* name, mode_t mode,
                      dev_t rdev) {
  struct inode* dir = inode_of(parent);
  GATE(req, kMeta, dir, name);
  if (mknodat(dir->fd, name, mode, rdev) != 0)
    fuse_reply_err(req, errno);
  else
    reply_entry(req, dir, name);
}

static void sfs_mkdir(fuse_req_t req, fuse_ino_t parent, const char* name, mode_t mode) {
  struct inode* dir = inode_of(parent);
  GATE(req, kMeta, dir, name);
  if (mkdirat(dir->fd, name, mode) != 0)
    fuse_reply_err(req, errno);
  else
    reply_entry(req, dir, name);
}

static void sfs_symlink(fuse_req_t req, const char* target, fuse_ino_t parent, const char* name) {
  struct inode* dir = inode_of(parent);
  GATE(req, kMeta, dir, name);
  if (symlinkat(target, dir->fd, name) != 0)
    fuse_reply_err(req, errno);
  else
    reply_entry(req, dir, name);
}

static void sfs_link(fuse_req_t req, fuse_ino_t ino, fuse_ino_t parent, const char* name) {
  struct inode* in = inode_of(ino);
  struct inode* dir = inode_of(parent);
  GATE(req, kMeta, dir, name);
  char path[64];
  proc_path(in, path, sizeof(path));
  if (linkat(AT_FDCWD, path, dir->fd, name, AT_SYMLINK_FOLLOW) != 0)
    fuse_reply_err(req, errno);
  else
    reply_entry(req, dir, name);
}

static void sfs_unlink(fuse_req_t req, fuse_ino_t parent, const char* name) {
  struct inode* dir = inode_of(parent);
  GATE(req, kMeta, dir, name);
  fuse_reply_err(req, unlinkat(dir->fd, name, 0) == 0 ? 0 : errno);
}

static void sfs_rmdir(fuse_req_t req, fuse_ino_t parent, const char* name) {
  struct inode* dir = inode_of(parent);
  GATE(req, kMeta, dir, name);
  fuse_reply_err(req, unlinkat(dir->fd, name, AT_REMOVEDIR) == 0 ? 0 : errno);
}

static void sfs_rename(fuse_req_t req, fuse_ino_t parent, const char* name, fuse_ino_t newparent,
                       const char* newname, unsigned int flags) {
  struct inode* from = inode_of(parent);
  struct inode* to = inode_of(newparent);
  GATE(req, kMeta, from, name);
  /* RENAME_NOREPLACE and RENAME_EXCHANGE go to the backing file system as they came. */
  int r = renameat2(from->fd, name, to->fd, newname, flags);
  fuse_reply_err(req, r == 0 ? 0 : errno);
}

/* ---- files ------------------------------------------------------------------------------- */

/* The flags a backing file is opened with. O_DIRECT stays on the FUSE file (the kernel then
 * bypasses its page cache) but not on the backing one, whose buffers here are unaligned.
 * O_NOFOLLOW is gone because the kernel has resolved the name already (and a reopen through
 * /proc/self/fd is a magic link that O_NOFOLLOW would refuse). */
static int backing_flags(int flags) {
  return (flags & ~(O_DIRECT | O_NOFOLLOW | O_NOCTTY)) | O_CLOEXEC;
}

static void opened(fuse_req_t req, struct fuse_file_info* fi, int fd) {
  fi->fh = (uint64_t)fd;
  if (g_direct_io) fi->direct_io = 1;
  if (fuse_reply_open(req, fi) != 0) close(fd); /* the caller is gone (interrupted) */
}

static void sfs_open(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info* fi) {
  struct inode* in = inode_of(ino);
  GATE(req, kMeta, in, NULL);
  char path[64];
  proc_path(in, path, sizeof(path));
  int fd = open(path, backing_flags(fi->flags) & ~(O_CREAT | O_EXCL));
  if (fd < 0)
    fuse_reply_err(req, errno);
  else
    opened(req, fi, fd);
}

static void sfs_create(fuse_req_t req, fuse_ino_t parent, const char* name, mode_t mode,
                       struct fuse_file_info* fi) {
  struct inode* dir = inode_of(parent);
  GATE(req, kMeta, dir, name);
  /* O_EXCL comes through: the backing create is as exclusive as the caller asked. */
  int flags = (fi->flags & ~(O_DIRECT | O_NOCTTY)) | O_CREAT | O_CLOEXEC;
  int fd = openat(dir->fd, name, flags, mode);
  if (fd < 0) {
    fuse_reply_err(req, errno);
    return;
  }
  struct fuse_entry_param e;
  int err = do_lookup(dir, name, &e);
  if (err) {
    close(fd);
    fuse_reply_err(req, err);
    return;
  }
  fi->fh = (uint64_t)fd;
  if (g_direct_io) fi->direct_io = 1;
  if (fuse_reply_create(req, &e, fi) != 0) {
    close(fd);
    forget_one(e.ino, 1);
  }
}

static void sfs_read(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
                     struct fuse_file_info* fi) {
  GATE(req, kData, inode_of(ino), NULL);
  char* buf = malloc(size ? size : 1);
  if (!buf) {
    fuse_reply_err(req, ENOMEM);
    return;
  }
  ssize_t n = pread((int)fi->fh, buf, size, off);
  if (n < 0)
    fuse_reply_err(req, errno);
  else
    fuse_reply_buf(req, buf, (size_t)n);
  free(buf);
}

static void sfs_write(fuse_req_t req, fuse_ino_t ino, const char* buf, size_t size, off_t off,
                      struct fuse_file_info* fi) {
  GATE(req, kData, inode_of(ino), NULL);
  ssize_t n = pwrite((int)fi->fh, buf, size, off);
  if (n < 0)
    fuse_reply_err(req, errno);
  else
    fuse_reply_write(req, (size_t)n);
}

static void sfs_flush(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info* fi) {
  GATE(req, kData, inode_of(ino), NULL);
  /* close(2) of a duplicate reports a deferred write error of the backing file, as close of
   * the caller's descriptor would on a local file system. */
  int dup_fd = dup((int)fi->fh);
  if (dup_fd < 0) {
    fuse_reply_err(req, errno);
    return;
  }
  fuse_reply_err(req, close(dup_fd) == 0 ? 0 : errno);
}

static void sfs_release(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info* fi) {
  (void)ino;
  close((int)fi->fh);
  fuse_reply_err(req, 0);
}

static void sfs_fsync(fuse_req_t req, fuse_ino_t ino, int datasync, struct fuse_file_info* fi) {
  GATE(req, kData, inode_of(ino), NULL);
  int r = datasync ? fdatasync((int)fi->fh) : fsync((int)fi->fh);
  fuse_reply_err(req, r == 0 ? 0 : errno);
}

static void sfs_fallocate(fuse_req_t req, fuse_ino_t ino, int mode, off_t off, off_t len,
                          struct fuse_file_info* fi) {
  GATE(req, kData, inode_of(ino), NULL);
  fuse_reply_err(req, fallocate((int)fi->fh, mode, off, len) == 0 ? 0 : errno);
}

/* ---- directories ------------------------------------------------------------------------- */

struct dir_handle {
  DIR* dir;
  off_t offset;         /* where the stream stands (telldir cookies) */
  struct dirent* entry; /* read but not yet returned (did not fit the last reply) */
};

static void sfs_opendir(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info* fi) {
  struct inode* in = inode_of(ino);
  GATE(req, kMeta, in, NULL);
  struct dir_handle* d = calloc(1, sizeof(*d));
  int fd = openat(in->fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (!d || fd < 0 || !(d->dir = fdopendir(fd))) {
    int err = d ? errno : ENOMEM;
    if (fd >= 0) close(fd);
    free(d);
    fuse_reply_err(req, err);
    return;
  }
  fi->fh = (uint64_t)(uintptr_t)d;
  if (fuse_reply_open(req, fi) != 0) {
    closedir(d->dir);
    free(d);
  }
}

static void sfs_readdir(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
                        struct fuse_file_info* fi) {
  GATE(req, kMeta, inode_of(ino), NULL);
  struct dir_handle* d = (struct dir_handle*)(uintptr_t)fi->fh;
  char* buf = malloc(size);
  if (!buf) {
    fuse_reply_err(req, ENOMEM);
    return;
  }
  if (off != d->offset) {
    seekdir(d->dir, off);
    d->entry = NULL;
    d->offset = off;
  }
  size_t used = 0;
  int err = 0;
  for (;;) {
    if (!d->entry) {
      errno = 0;
      d->entry = readdir(d->dir);
      if (!d->entry) {
        err = errno;
        break;
      }
    }
    struct stat st;
    memset(&st, 0, sizeof(st));
    st.st_ino = d->entry->d_ino;
    st.st_mode = (mode_t)DTTOIF(d->entry->d_type);
    off_t next = telldir(d->dir);
    size_t len = fuse_add_direntry(req, buf + used, size - used, d->entry->d_name, &st, next);
    if (len > size - used) break; /* full: this entry goes first in the next reply */
    used += len;
    d->entry = NULL;
    d->offset = next;
  }
  if (err && used == 0)
    fuse_reply_err(req, err);
  else
    fuse_reply_buf(req, buf, used);
  free(buf);
}

static void sfs_releasedir(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info* fi) {
  (void)ino;
  struct dir_handle* d = (struct dir_handle*)(uintptr_t)fi->fh;
  closedir(d->dir);
  free(d);
  fuse_reply_err(req, 0);
}

static void sfs_fsyncdir(fuse_req_t req, fuse_ino_t ino, int datasync, struct fuse_file_info* fi) {
  GATE(req, kMeta, inode_of(ino), NULL);
  int fd = dirfd(((struct dir_handle*)(uintptr_t)fi->fh)->dir);
  int r = datasync ? fdatasync(fd) : fsync(fd);
  fuse_reply_err(req, r == 0 ? 0 : errno);
}

/* ---- control ----------------------------------------------------------------------------- */

static int parse_class(const char* word, int* out) {
  if (!word || !strcmp(word, "all"))
    *out = kAll;
  else if (!strcmp(word, "data"))
    *out = kData;
  else if (!strcmp(word, "meta"))
    *out = kMeta;
  else
    return -1;
  return 0;
}

static const char* class_name(int cls) {
  return cls == kAll ? "all" : cls == kData ? "data" : cls == kMeta ? "meta" : "none";
}

/* Carries out one command line; writes the reply (without newline) into `reply`. */
static void command(char* line, char* reply, size_t size) {
  char* save = NULL;
  const char* verb = strtok_r(line, " \t\r", &save);
  const char* a = strtok_r(NULL, " \t\r", &save);
  const char* b = strtok_r(NULL, " \t\r", &save);
  int cls = kAll;
  if (!verb) {
    snprintf(reply, size, "err empty command");
    return;
  }
  pthread_mutex_lock(&g_lock);
  if (!strcmp(verb, "ping")) {
    snprintf(reply, size, "ok");
  } else if (!strcmp(verb, "freeze")) {
    if (parse_class(a, &cls)) {
      snprintf(reply, size, "err class must be data, meta or all");
    } else {
      g_faults.frozen = cls;
      pthread_cond_broadcast(&g_thawed); /* narrowing the class releases the others */
      snprintf(reply, size, "ok");
    }
  } else if (!strcmp(verb, "thaw")) {
    g_faults.frozen = 0;
    pthread_cond_broadcast(&g_thawed);
    snprintf(reply, size, "ok");
  } else if (!strcmp(verb, "fail") || !strcmp(verb, "delay")) {
    char* end = NULL;
    long value = a ? strtol(a, &end, 10) : -1;
    if (!a || *end || value < 0) {
      snprintf(reply, size, "err %s needs a number >= 0", verb);
    } else if (parse_class(b, &cls)) {
      snprintf(reply, size, "err class must be data, meta or all");
    } else if (verb[0] == 'f') {
      g_faults.fail_errno = (int)value;
      g_faults.fail_classes = value ? cls : 0;
      snprintf(reply, size, "ok");
    } else {
      g_faults.delay_ms = value;
      g_faults.delay_classes = value ? cls : 0;
      snprintf(reply, size, "ok");
    }
  } else if (!strcmp(verb, "match")) {
    snprintf(g_faults.match, sizeof(g_faults.match), "%s", a ? a : "");
    pthread_cond_broadcast(&g_thawed);
    snprintf(reply, size, "ok");
  } else if (!strcmp(verb, "reset")) {
    memset(&g_faults, 0, sizeof(g_faults));
    pthread_cond_broadcast(&g_thawed);
    snprintf(reply, size, "ok");
  } else if (!strcmp(verb, "status")) {
    snprintf(reply, size,
             "ok frozen=%s fail=%d:%s delay=%ld:%s blocked=%ld active=%ld ops=%ld match=%s",
             class_name(g_faults.frozen), g_faults.fail_errno, class_name(g_faults.fail_classes),
             g_faults.delay_ms, class_name(g_faults.delay_classes), g_blocked,
             __atomic_load_n(&g_active, __ATOMIC_SEQ_CST), g_ops, g_faults.match);
  } else {
    snprintf(reply, size,
             "err unknown command '%s' (ping, freeze, thaw, fail, delay, match, reset, status)",
             verb);
  }
  pthread_mutex_unlock(&g_lock);
}

static void serve(int client) {
  char line[PATH_MAX + 64];
  size_t used = 0;
  for (;;) {
    ssize_t n = read(client, line + used, sizeof(line) - 1 - used);
    if (n <= 0) return;
    used += (size_t)n;
    line[used] = '\0';
    char* nl;
    while ((nl = strchr(line, '\n')) != NULL) {
      *nl = '\0';
      char reply[PATH_MAX + 256];
      command(line, reply, sizeof(reply) - 1);
      size_t len = strlen(reply);
      reply[len++] = '\n';
      if (write(client, reply, len) != (ssize_t)len) return;
      used -= (size_t)(nl + 1 - line);
      memmove(line, nl + 1, used + 1);
    }
    if (used == sizeof(line) - 1) return; /* a line too long to be a command */
  }
}

static void* control_loop(void* unused) {
  (void)unused;
  for (;;) {
    int client = accept4(g_control_fd, NULL, NULL, SOCK_CLOEXEC);
    if (client < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      return NULL;
    }
    serve(client);
    close(client);
  }
}

static void sfs_init(void* userdata, struct fuse_conn_info* conn) {
  (void)userdata;
  /* Every write(2) reaches the daemon while the caller waits (write-through). */
  conn->want &= ~FUSE_CAP_WRITEBACK_CACHE;

  g_control_fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  struct sockaddr_un addr;
  memset(&addr, 0, sizeof(addr));
  addr.sun_family = AF_UNIX;
  snprintf(addr.sun_path, sizeof(addr.sun_path), "%s", g_control_path);
  unlink(g_control_path);
  pthread_t thread;
  if (g_control_fd < 0 || bind(g_control_fd, (struct sockaddr*)&addr, sizeof(addr)) != 0 ||
      listen(g_control_fd, 16) != 0 || pthread_create(&thread, NULL, control_loop, NULL) != 0) {
    perror("stallfs: control socket");
    fuse_session_exit(g_se);
    return;
  }
  pthread_detach(thread);
}

static void sfs_destroy(void* userdata) {
  (void)userdata;
  if (g_control_path) unlink(g_control_path);
}

static const struct fuse_lowlevel_ops kOps = {
    .init = sfs_init,
    .destroy = sfs_destroy,
    .lookup = sfs_lookup,
    .forget = sfs_forget,
    .getattr = sfs_getattr,
    .setattr = sfs_setattr,
    .readlink = sfs_readlink,
    .mknod = sfs_mknod,
    .mkdir = sfs_mkdir,
    .unlink = sfs_unlink,
    .rmdir = sfs_rmdir,
    .symlink = sfs_symlink,
    .rename = sfs_rename,
    .link = sfs_link,
    .open = sfs_open,
    .read = sfs_read,
    .write = sfs_write,
    .flush = sfs_flush,
    .release = sfs_release,
    .fsync = sfs_fsync,
    .opendir = sfs_opendir,
    .readdir = sfs_readdir,
    .releasedir = sfs_releasedir,
    .fsyncdir = sfs_fsyncdir,
    .statfs = sfs_statfs,
    .access = sfs_access,
    .create = sfs_create,
    .forget_multi = sfs_forget_multi,
    .fallocate = sfs_fallocate,
    /* No getlk, setlk or flock: the kernel handles POSIX, OFD and flock locks locally. */
};

static int usage(const char* argv0) {
  fprintf(stderr,
          "usage: %s --backing DIR --control SOCKET [--direct-io] [-o OPTIONS] MOUNTPOINT\n",
          argv0);
  return 2;
}

int main(int argc, char* argv[]) {
  const char* backing = NULL;
  const char* mountpoint = NULL;
  struct fuse_args args = FUSE_ARGS_INIT(0, NULL);
  if (fuse_opt_add_arg(&args, argv[0]) != 0) return 1;
  for (int i = 1; i < argc; ++i) {
    if (!strcmp(argv[i], "--backing") && i + 1 < argc) {
      backing = argv[++i];
    } else if (!strcmp(argv[i], "--control") && i + 1 < argc) {
      g_control_path = argv[++i];
    } else if (!strcmp(argv[i], "--direct-io")) {
      g_direct_io = 1;
    } else if (!strcmp(argv[i], "-f")) {
      /* always in the foreground */
    } else if (!strcmp(argv[i], "-o") && i + 1 < argc) {
      if (fuse_opt_add_arg(&args, "-o") != 0 || fuse_opt_add_arg(&args, argv[++i]) != 0) return 1;
    } else if (!mountpoint && argv[i][0] != '-') {
      mountpoint = argv[i];
    } else {
      return usage(argv[0]);
    }
  }
  if (!backing || !g_control_path || !mountpoint) return usage(argv[0]);
  if (strlen(g_control_path) >= sizeof(((struct sockaddr_un*)0)->sun_path)) {
    fprintf(stderr, "stallfs: control socket path too long: %s\n", g_control_path);
    return 2;
  }
  g_root.fd = open(backing, O_PATH | O_DIRECTORY | O_CLOEXEC);
  if (g_root.fd < 0) {
    fprintf(stderr, "stallfs: cannot open backing directory %s: %s\n", backing, strerror(errno));
    return 1;
  }
  g_root.nlookup = 1;
  umask(0); /* modes come from the callers (the kernel applied their umask), as locally */

  g_se = fuse_session_new(&args, &kOps, sizeof(kOps), NULL);
  if (!g_se) return 1;
  int status = 1;
  if (fuse_set_signal_handlers(g_se) == 0) {
    if (fuse_session_mount(g_se, mountpoint) == 0) {
      struct fuse_loop_config* config = fuse_loop_cfg_create();
      if (config) {
        /* Enough threads that frozen operations do not starve the others. */
        fuse_loop_cfg_set_max_threads(config, 256);
        status = fuse_session_loop_mt(g_se, config) == 0 ? 0 : 1;
        fuse_loop_cfg_destroy(config);
      }
      fuse_session_unmount(g_se);
    }
    fuse_remove_signal_handlers(g_se);
  }
  fuse_session_destroy(g_se);
  fuse_opt_free_args(&args);
  return status;
}
