// Model files must be regular files: a FIFO, a directory or a device in their place is an error at once
// (opening a FIFO for reading would otherwise wait for a writer forever, and loading with it).
#include <sys/stat.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

#include "puredrive/util/mapped_file.h"

namespace pd {
namespace {

class TempDir {
 public:
  TempDir() {
    char tmpl[] = "/tmp/pd-mapped-file-XXXXXX";
    path_ = mkdtemp(tmpl);
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  std::string operator/(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

TEST(MappedFile, ReadsRegularFiles) {
  TempDir dir;
  std::ofstream(dir / "config.json") << "{\"a\": 1}";
  auto text = read_text_file(dir / "config.json");
  ASSERT_TRUE(text.has_value()) << text.status().message();
  EXPECT_EQ(*text, "{\"a\": 1}");
  auto mapped = MappedFile::open(dir / "config.json");
  ASSERT_TRUE(mapped.has_value());
  EXPECT_EQ((*mapped)->size(), 8u);
  EXPECT_EQ(read_text_file(dir / "missing.json").status().code(), ErrorCode::kNotFound);
}

TEST(MappedFile, RefusesFifosAndDirectories) {
  TempDir dir;
  ASSERT_EQ(mkfifo((dir / "model.safetensors").c_str(), 0600), 0);
  std::filesystem::create_directory(dir / "config.json");
  for (const std::string name : {"model.safetensors", "config.json"}) {
    auto text = read_text_file(dir / name);
    ASSERT_FALSE(text.has_value()) << name;
    EXPECT_NE(text.status().message().find("not a regular file"), std::string::npos)
        << text.status().message();
    auto mapped = MappedFile::open(dir / name);
    ASSERT_FALSE(mapped.has_value()) << name;
    EXPECT_NE(mapped.status().message().find("not a regular file"), std::string::npos);
  }
  auto dev = read_text_file("/dev/zero");  // would read forever
  ASSERT_FALSE(dev.has_value());
}

}  // namespace
}  // namespace pd
