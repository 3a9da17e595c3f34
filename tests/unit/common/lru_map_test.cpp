// LruMap: entries in order of use; find and put make an entry the most
// recently used; the oldest is the one dropped.
#include "common/lru_map.h"

#include <gtest/gtest.h>

#include <string>

namespace tandem {
namespace {

TEST(LruMap, TheOldestIsTheLeastRecentlyFoundOrPut) {
  LruMap<std::string, int> map;
  EXPECT_EQ(map.find("a"), nullptr);
  map.put("a", 1);
  map.put("b", 2);
  map.put("c", 3);
  EXPECT_EQ(map.size(), 3u);
  EXPECT_EQ(map.oldest().first, "a");
  ASSERT_NE(map.find("a"), nullptr);  // a is now the most recently used
  EXPECT_EQ(*map.find("a"), 1);
  EXPECT_EQ(map.oldest().first, "b");
  map.put("b", 20);  // replaced, and most recently used
  EXPECT_EQ(map.size(), 3u);
  EXPECT_EQ(*map.find("b"), 20);
  EXPECT_EQ(map.oldest().first, "c");
  map.popOldest();
  EXPECT_EQ(map.find("c"), nullptr);
  EXPECT_EQ(map.oldest().first, "a");
  map.popOldest();
  map.popOldest();
  EXPECT_EQ(map.size(), 0u);
  EXPECT_EQ(map.find("b"), nullptr);
}

}  // namespace
}  // namespace tandem
