// Stores one block with the installed kvtier library, loads it back and checks the bytes.
// Usage: kvtier_consumer [directory]   (default: a fresh directory under $TMPDIR or /tmp)
// Exits 0 on success, 1 with a message otherwise.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include <kvtier/kvtier.hpp>

namespace {

int fail(const std::string& what) {
  std::fprintf(stderr, "kvtier_consumer: %s\n", what.c_str());
  return 1;
}

// Runs one job to completion and returns it.
kvtier::Completion run(kvtier::Engine& engine, kvtier::JobId id, kvtier::Direction direction,
                       kvtier::BlockOp op) {
  std::vector<kvtier::BlockOp> blocks;
  blocks.push_back(std::move(op));
  engine.submit(id, direction, std::move(blocks));
  engine.drain();
  std::vector<kvtier::Completion> done = engine.pop_completions();
  if (done.size() != 1 || done[0].job_id != id) {
    std::fprintf(stderr, "kvtier_consumer: expected exactly job %lld\n",
                 static_cast<long long>(id));
    std::exit(1);
  }
  return std::move(done[0]);
}

}  // namespace

int main(int argc, char** argv) {
  std::string dir;
  bool own_dir = false;
  if (argc > 1) {
    dir = argv[1];
  } else {
    const char* base = std::getenv("TMPDIR");
    std::string tmpl =
        std::string(base != nullptr && *base ? base : "/tmp") + "/kvtier-consumer.XXXXXX";
    if (::mkdtemp(tmpl.data()) == nullptr) return fail("mkdtemp failed");
    dir = tmpl;
    own_dir = true;
  }

  kvtier::EngineConfig config;
  config.set_root_dir(dir).set_n_read_threads(2).set_n_write_threads(2).set_fingerprint(
      "consumer-example");
  kvtier::Engine engine(config);

  // An odd length, so the zero padding of the file format is exercised too.
  std::vector<unsigned char> payload(3 * 4096 + 123);
  for (std::size_t i = 0; i < payload.size(); ++i)
    payload[i] = static_cast<unsigned char>(i * 31 + 7);
  const std::string path = dir + "/blocks/0001";

  kvtier::BlockOp store;
  store.path = path;
  store.key = "block-0001";
  store.data = payload.data();
  store.length = payload.size();
  const kvtier::Completion stored = run(engine, 1, kvtier::Direction::kStore, store);
  if (!stored.success)
    return fail("store failed: " + stored.error.operation + " " + stored.error.path + ": " +
                stored.error.message);

  std::vector<unsigned char> back(payload.size(), 0);
  kvtier::BlockOp load = store;
  load.data = back.data();
  const kvtier::Completion loaded = run(engine, 2, kvtier::Direction::kLoad, load);
  if (!loaded.success)
    return fail("load failed: " + loaded.error.operation + " " + loaded.error.path + ": " +
                loaded.error.message);
  if (loaded.bytes != payload.size()) return fail("load reported the wrong byte count");
  if (std::memcmp(back.data(), payload.data(), payload.size()) != 0)
    return fail("loaded bytes differ");

  engine.shutdown();
  std::printf("kvtier_consumer: stored and loaded %zu bytes at %s (O_DIRECT %s, crc32c %s)\n",
              payload.size(), path.c_str(), engine.direct_io() ? "on" : "off",
              kvtier::crc32c_is_hardware() ? "hardware" : "software");
  if (own_dir) std::filesystem::remove_all(dir);
  return 0;
}
