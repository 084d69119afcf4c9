#include "transfer_engine/platform/util/sysfs.h"

#include <fstream>
#include <string_view>

#include "transfer_engine/platform/util/parse.h"

namespace mooncake::te::platform_util {

int ReadNumaNode(const std::string& path) {
  std::ifstream in(path);
  std::string text;
  if (!in || !std::getline(in, text)) return -1;
  std::string_view v(text);
  while (!v.empty() && (v.back() == ' ' || v.back() == '\t' || v.back() == '\r')) v.remove_suffix(1);
  int node = -1;
  return ParseDecimalInt(v, &node) ? node : -1;
}

}  // namespace mooncake::te::platform_util
